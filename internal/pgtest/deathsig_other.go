//go:build !linux

package pgtest

import "syscall"

// dieWithParent: only Linux can tie a child's life to its parent's; the
// test's cleanup stops the server elsewhere.
func dieWithParent(*syscall.SysProcAttr) {}
