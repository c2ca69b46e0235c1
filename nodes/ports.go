package nodes

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"fleet"
)

// allocatePort picks a port for ws and reserves it (ws.w.Port) under the
// same lock, so two workers launching at once cannot pick the same one: its
// previous port when still free of other workers, else the first free one in
// the node's ports (enginePorts). Nodes that share a host share one port space: local and sim
// nodes (and SSH nodes at a loopback address) are all the hub's machine, and
// SSH nodes at the same host are one machine. On the hub's machine the port
// must also be free to bind.
func (m *Manager) allocatePort(ws *workerState, node fleet.Node) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	space := portSpace(node)
	_, sim := node.SimProfile()
	testBind := sim || node.Address == fleet.AddressLocal
	used := map[int]bool{}
	for _, o := range m.workers {
		if o == ws || o.w.Port == 0 {
			continue
		}
		if o.placement.Node == node.Name {
			used[o.w.Port] = true
			continue
		}
		if ns, ok := m.nodes[o.placement.Node]; ok && portSpace(ns.node) == space {
			used[o.w.Port] = true
		}
	}
	for p := range ws.strangerPorts {
		used[p] = true
	}
	ports := m.enginePorts(node)
	free := func(p int) bool {
		if used[p] || p < ports.Min || p > ports.Max {
			return false
		}
		if !testBind {
			return true // enginectl.CheckPort judges a remote port
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			return false
		}
		ln.Close()
		return true
	}
	pick := 0
	if ws.w.Port != 0 && free(ws.w.Port) {
		pick = ws.w.Port
	}
	for p := ports.Min; pick == 0 && p <= ports.Max; p++ {
		if free(p) {
			pick = p
		}
	}
	if pick == 0 {
		return 0, fmt.Errorf("no free port in %s on node %s: widen its ports (ports: in the fleet file, or serve --engine-ports for every node) or remove workers", ports, node.Name)
	}
	ws.w.Port = pick
	return pick, nil
}

// enginePorts are the ports node's engines may listen on: the node's own
// (fleet file ports:), else the hub's (serve --engine-ports).
func (m *Manager) enginePorts(node fleet.Node) fleet.PortRange {
	return node.Ports.Or(fleet.PortRange{Min: m.opts.PortMin, Max: m.opts.PortMax})
}

// skipStrangerPort remembers that port, picked for ws, is held by a process
// that is not an engine of ours, so allocatePort does not pick it again.
func (m *Manager) skipStrangerPort(ws *workerState, port int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ws.strangerPorts == nil {
		ws.strangerPorts = map[int]bool{}
	}
	ws.strangerPorts[port] = true
}

// portSpace names the machine whose ports a node's engines bind.
func portSpace(n fleet.Node) string {
	if _, sim := n.SimProfile(); sim || n.Address == fleet.AddressLocal {
		return "hub"
	}
	_, hostPort, err := ParseSSHAddress(n.Address)
	if err != nil {
		return "node " + n.Name
	}
	host, _, err := net.SplitHostPort(hostPort)
	if err != nil {
		return "node " + n.Name
	}
	if host == "localhost" {
		return "hub"
	}
	if ip := net.ParseIP(host); ip != nil {
		if ip.IsLoopback() {
			return "hub"
		}
		return "host " + ip.String()
	}
	return "host " + strings.ToLower(strings.TrimSuffix(host, "."))
}

// portLostError is a launch that lost its freshly picked port to another
// process; the supervisor relaunches on another port at once, a few times.
type portLostError struct{ err error }

func (e *portLostError) Error() string { return e.err.Error() }
func (e *portLostError) Unwrap() error { return e.err }

// maxPortLosses bounds immediate relaunches after lost ports; beyond it the
// usual backoff applies.
const maxPortLosses = 3
