package vrrptest

import (
	"os"
	"strings"
	"testing"
)

// docMember is the first hub of docs/several-hubs.md's example.
var docMember = Member{
	Name: "hub1", Interface: "eth0", IP: "10.0.0.11", Peers: []string{"10.0.0.12", "10.0.0.13"},
	VIP: "10.0.0.100/24", RouterID: 51, Priority: 150, HealthURL: "http://127.0.0.1:8080/healthz",
}

// TestDocsShowTheTestedConfig: the keepalived.conf docs/several-hubs.md
// tells a lab to install is, byte for byte, what Config writes for the
// failover tests, with the example's addresses.
func TestDocsShowTheTestedConfig(t *testing.T) {
	b, err := os.ReadFile("../../docs/several-hubs.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := Config(docMember); !strings.Contains(string(b), "```\n"+want+"```\n") {
		t.Errorf("docs/several-hubs.md does not show the configuration the tests run; put this there, in a code block:\n%s", want)
	}
}
