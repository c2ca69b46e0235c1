package mdns

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
)

func TestParseName(t *testing.T) {
	for _, tt := range []struct {
		in, want, err string
	}{
		{in: "fleet", want: "fleet"},
		{in: "fleet.local", want: "fleet"},
		{in: "Lab-Hub.local.", want: "lab-hub"},
		{in: "", err: "empty"},
		{in: ".local", err: "empty"},
		{in: "-fleet", err: "starts or ends"},
		{in: "my.fleet", err: `holds '.'`},
		{in: "flé", err: "letters, digits"},
		{in: strings.Repeat("a", 64), err: "at most 63"},
	} {
		got, err := ParseName(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("ParseName(%q) = %q, %v; want an error saying %q", tt.in, got, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseName(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func TestSSHConfig(t *testing.T) {
	if got, want := SSHConfig("fleet", 2222), "Host fleet.local\n    Port 2222\n"; got != want {
		t.Errorf("SSHConfig(fleet, 2222) = %q; want %q", got, want)
	}
	if got := SSHConfig("fleet", 22); got != "" {
		t.Errorf("SSHConfig on port 22 = %q; ssh fleet.local needs no stanza there", got)
	}
}

// TestPickInterfaces: a console bound to one address is announced with that
// address only; one bound to every address with each LAN interface's, never
// loopback, a down interface or an IPv6 address without its zone.
func TestPickInterfaces(t *testing.T) {
	up := net.FlagUp | net.FlagMulticast
	ifaces := []net.Interface{
		{Index: 1, Name: "lo", Flags: up | net.FlagLoopback},
		{Index: 2, Name: "eth0", Flags: up},
		{Index: 3, Name: "wlan0", Flags: up},
		{Index: 4, Name: "eth1", Flags: net.FlagMulticast}, // down
		{Index: 5, Name: "tun0", Flags: net.FlagUp},        // no multicast
	}
	addrs := map[string][]string{
		"lo":    {"127.0.0.1", "::1"},
		"eth0":  {"192.168.1.10", "fe80::1", "2001:db8::10"},
		"wlan0": {"192.168.7.20"},
		"eth1":  {"10.0.0.1"},
		"tun0":  {"100.64.0.1"},
	}
	lookup := func(ifi net.Interface) ([]net.IP, error) {
		var ips []net.IP
		for _, s := range addrs[ifi.Name] {
			ips = append(ips, net.ParseIP(s))
		}
		return ips, nil
	}
	for _, tt := range []struct {
		host string
		want []string // iface=ip,ip
		err  string
	}{
		{host: "192.168.1.10", want: []string{"eth0=192.168.1.10"}},
		{host: "2001:db8::10", want: []string{"eth0=2001:db8::10"}},
		{host: "0.0.0.0", want: []string{"eth0=192.168.1.10", "wlan0=192.168.7.20"}},
		{host: "::", want: []string{"eth0=192.168.1.10,2001:db8::10", "wlan0=192.168.7.20"}},
		{host: "", want: []string{"eth0=192.168.1.10,2001:db8::10", "wlan0=192.168.7.20"}},
		{host: "10.0.0.1", err: "no interface that is up"},
		{host: "100.64.0.1", err: "no interface that is up"},
		{host: "127.0.0.1", err: "loopback"},
		{host: "fleet.lan", err: "not an IP address"},
	} {
		got, err := pickInterfaces(tt.host, ifaces, lookup)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("pickInterfaces(%q) = %v, %v; want an error saying %q", tt.host, got, err, tt.err)
			}
			continue
		}
		var gotS []string
		for _, g := range got {
			var ips []string
			for _, ip := range g.ips {
				ips = append(ips, ip.String())
			}
			gotS = append(gotS, fmt.Sprintf("%s=%s", g.iface.Name, strings.Join(ips, ",")))
		}
		if err != nil || !slices.Equal(gotS, tt.want) {
			t.Errorf("pickInterfaces(%q) = %v, %v; want %v", tt.host, gotS, err, tt.want)
		}
	}
}
