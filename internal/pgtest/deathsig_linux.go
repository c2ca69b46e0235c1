package pgtest

import "syscall"

// dieWithParent has the kernel kill a server whose test binary died
// without its cleanups (a go test timeout), rather than leave it running.
func dieWithParent(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }
