// Package mdns gives the hub a name on the LAN: it announces NAME.local by
// multicast DNS, with an _ssh._tcp service for the console, so an operator
// types `ssh fleet.local` on any laptop of the network (macOS resolves .local
// names natively; Linux does with nss-mdns). The protocol is
// github.com/hashicorp/mdns's; this package picks what to announce and where.
package mdns

import (
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"strconv"
	"strings"

	hmdns "github.com/hashicorp/mdns"
)

// ServiceType is the DNS-SD service the console is announced as.
const ServiceType = "_ssh._tcp"

// DefaultName is the name the hub announces unless told otherwise.
const DefaultName = "fleet"

// ParseName checks a name given by the operator and returns its single DNS
// label: "fleet" and "fleet.local" both give "fleet".
func ParseName(s string) (string, error) {
	label := strings.TrimSuffix(strings.TrimSuffix(strings.ToLower(s), "."), ".local")
	switch {
	case label == "":
		return "", fmt.Errorf("mDNS name %q is empty: give a name such as %s (announced as %s.local)", s, DefaultName, DefaultName)
	case len(label) > 63:
		return "", fmt.Errorf("mDNS name %q is %d characters long; a DNS label holds at most 63", s, len(label))
	case strings.HasPrefix(label, "-") || strings.HasSuffix(label, "-"):
		return "", fmt.Errorf("mDNS name %q starts or ends with '-': use letters, digits and inner hyphens, e.g. fleet-lab", s)
	}
	for _, r := range label {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return "", fmt.Errorf("mDNS name %q holds %q: use letters, digits and hyphens only (one label, e.g. fleet-lab)", s, r)
		}
	}
	return label, nil
}

// SSHConfig is the ~/.ssh/config stanza that makes `ssh NAME.local` reach a
// console on port; on port 22 none is needed and it returns "".
func SSHConfig(name string, port int) string {
	if port == 22 {
		return ""
	}
	return fmt.Sprintf("Host %s.local\n    Port %d\n", name, port)
}

// Announcement is a running announcement; Close withdraws it.
type Announcement struct {
	// Host is the announced host name, e.g. "fleet.local".
	Host string
	// IPs are the addresses announced for Host.
	IPs     []net.IP
	servers []*hmdns.Server
}

// Close stops answering queries.
func (a *Announcement) Close() error {
	var errs []error
	for _, s := range a.servers {
		errs = append(errs, s.Shutdown())
	}
	return errors.Join(errs...)
}

// Announce answers mDNS queries for NAME.local (A and AAAA) and for the
// console's _ssh._tcp service on consoleAddr, the host:port the console
// listens on. A console bound to one address is announced with that address
// on its interface only; one bound to every address (0.0.0.0, [::]) with
// the addresses of every interface that is up and carries multicast.
func Announce(name, consoleAddr string, logger *slog.Logger) (*Announcement, error) {
	label, err := ParseName(name)
	if err != nil {
		return nil, err
	}
	host, portStr, err := net.SplitHostPort(consoleAddr)
	if err != nil {
		return nil, fmt.Errorf("console address %q is not host:port: %w", consoleAddr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port <= 0 || port > 65535 {
		return nil, fmt.Errorf("console address %q has no fixed port to announce: give --ssh a port, e.g. 0.0.0.0:2222", consoleAddr)
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing network interfaces to announce %s.local on: %w", label, err)
	}
	targets, err := pickInterfaces(host, ifaces, interfaceAddrs)
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	a := &Announcement{Host: label + ".local"}
	for _, t := range targets {
		a.IPs = append(a.IPs, t.ips...)
	}
	fqdn := label + ".local."
	// Every interface's listener answers with every announced address: on
	// Linux a socket joined to the mDNS group hears the group on every
	// interface where any socket joined it, so answers per interface
	// would contradict each other.
	zone, err := hmdns.NewMDNSService(label, ServiceType, "local.", fqdn, port, a.IPs,
		[]string{"fleet console: ssh " + a.Host})
	if err != nil {
		return nil, fmt.Errorf("preparing the mDNS records for %s: %w", a.Host, err)
	}
	// The library logs protocol noise (malformed packets from other
	// devices) through the standard logger; keep it at debug level.
	libLog := log.New(slogWriter{logger}, "", 0)
	for _, t := range targets {
		iface := t.iface
		srv, err := hmdns.NewServer(&hmdns.Config{Zone: zone, Iface: &iface, Logger: libLog})
		if err != nil {
			logger.Warn("cannot announce by mDNS on this interface", "interface", iface.Name, "err", err)
			continue
		}
		a.servers = append(a.servers, srv)
	}
	if len(a.servers) == 0 {
		return nil, fmt.Errorf("no interface would take the mDNS multicast group 224.0.0.251 / ff02::fb (port 5353) to announce %s: "+
			"check that the interface is up with multicast on, or turn the announcement off with --mdns=", a.Host)
	}
	return a, nil
}

type target struct {
	iface net.Interface
	ips   []net.IP
}

// pickInterfaces chooses where to announce for a console listening on host.
// addrs is net.Interface.Addrs, replaced in tests.
func pickInterfaces(host string, ifaces []net.Interface, addrs func(net.Interface) ([]net.IP, error)) ([]target, error) {
	var want net.IP
	if host != "" {
		want = net.ParseIP(host)
		if want == nil {
			return nil, fmt.Errorf("console host %q is not an IP address: bind the console to an address (e.g. --ssh 0.0.0.0:2222) to announce it", host)
		}
		if want.IsLoopback() {
			return nil, fmt.Errorf("the console listens on loopback (%s): no other machine could reach it, so it is not announced", host)
		}
	}
	wildcard := want == nil || want.IsUnspecified()
	v4only := want != nil && want.To4() != nil // 0.0.0.0 takes IPv4 only
	var out []target
	for _, ifi := range ifaces {
		if ifi.Flags&net.FlagUp == 0 || ifi.Flags&net.FlagLoopback != 0 || ifi.Flags&net.FlagMulticast == 0 {
			continue
		}
		ips, err := addrs(ifi)
		if err != nil {
			continue
		}
		var keep []net.IP
		for _, ip := range ips {
			switch {
			case !wildcard:
				if ip.Equal(want) {
					keep = append(keep, ip)
				}
			case ip.IsLinkLocalUnicast() && ip.To4() == nil:
				// An IPv6 link-local address is useless without its zone,
				// which an A/AAAA record cannot carry.
			case v4only && ip.To4() == nil:
			case ip.IsGlobalUnicast() || ip.IsLinkLocalUnicast():
				keep = append(keep, ip)
			}
		}
		if len(keep) > 0 {
			out = append(out, target{iface: ifi, ips: keep})
		}
	}
	if len(out) == 0 {
		if !wildcard {
			return nil, fmt.Errorf("no interface that is up with multicast holds the console's address %s: "+
				"bind the console to one of this machine's LAN addresses, or turn the announcement off with --mdns=", host)
		}
		return nil, errors.New("no interface is up with multicast and an address to announce: " +
			"connect the machine to its LAN, or turn the announcement off with --mdns=")
	}
	return out, nil
}

func interfaceAddrs(ifi net.Interface) ([]net.IP, error) {
	addrs, err := ifi.Addrs()
	if err != nil {
		return nil, err
	}
	var ips []net.IP
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			ips = append(ips, n.IP)
		}
	}
	return ips, nil
}

// slogWriter turns the library's log lines into debug records.
type slogWriter struct{ log *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.log.Debug(strings.TrimSpace(string(p)), "component", "mdns")
	return len(p), nil
}
