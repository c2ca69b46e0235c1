package enginectl

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

func newGroup() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// sessionOf reads a process's session ID (the sixth field of /proc/PID/stat).
func sessionOf(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndex(s, ")")+1:])
	if len(f) < 4 {
		return 0, fmt.Errorf("short stat %q", s)
	}
	return strconv.Atoi(f[3])
}
