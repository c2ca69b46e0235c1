package nodes

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"golang.org/x/crypto/ssh"
)

// HostKeyStore pins each node's SSH host key. Keys travel in authorized_keys
// form ("ssh-ed25519 AAAA…"). The hub backs it with SQLite; MemoryHostKeys
// serves tests and hubs without a store.
type HostKeyStore interface {
	// PinnedHostKey returns the key pinned for node, or "" if none is.
	PinnedHostKey(ctx context.Context, node string) (string, error)
	// PinHostKey records key as node's host key (first contact, or an
	// operator's `fleet node trust`).
	PinHostKey(ctx context.Context, node, key string) error
}

// HostKeyChangedError is a node presenting a host key other than the pinned
// one. The node stays refused until an operator trusts the new key.
type HostKeyChangedError struct {
	Node string
	// Was and Now are SHA256 fingerprints as ssh-keygen -l prints them.
	Was, Now string
}

func (e *HostKeyChangedError) Error() string {
	return fmt.Sprintf("host key of node %s changed (was %s, now %s); if the machine was reinstalled, run `fleet node trust %s`",
		e.Node, e.Was, e.Now, e.Node)
}

// MemoryHostKeys is a HostKeyStore held in memory.
type MemoryHostKeys struct {
	mu   sync.Mutex
	keys map[string]string
}

func (m *MemoryHostKeys) PinnedHostKey(_ context.Context, node string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.keys[node], nil
}

func (m *MemoryHostKeys) PinHostKey(_ context.Context, node, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.keys == nil {
		m.keys = map[string]string{}
	}
	m.keys[node] = key
	return nil
}

// FormatHostKey renders a key in authorized_keys form, without the newline.
func FormatHostKey(key ssh.PublicKey) string {
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key)))
}

// HostKeyFingerprint is the SHA256 fingerprint of an authorized_keys-form
// key, or "" when it does not parse.
func HostKeyFingerprint(authorizedKey string) string {
	key, _, _, _, err := ssh.ParseAuthorizedKey([]byte(authorizedKey))
	if err != nil {
		return ""
	}
	return ssh.FingerprintSHA256(key)
}
