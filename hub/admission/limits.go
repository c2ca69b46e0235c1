package admission

import (
	"fmt"
	"sync"

	"fleet"
)

// MaxRunsPerUser bounds the shape and bench runs one user has going at
// once. Their requests go to workers around the router (counted as the
// workers' load there, see router.HoldSlot); twelve at once by one viewer
// filled a 4-slot worker.
const MaxRunsPerUser = 2

// userRuns counts each user's runs going. The zero value is ready.
type userRuns struct {
	mu      sync.Mutex
	running map[string]int
}

// start admits one more run for u, or says why not; done ends it.
func (c *userRuns) start(u fleet.User, what string) (done func(), err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running[u.Name] >= MaxRunsPerUser {
		return nil, fmt.Errorf("%s: %s already has %d shape or bench runs going (the limit per user); wait for one to finish", what, u.Name, MaxRunsPerUser)
	}
	if c.running == nil {
		c.running = map[string]int{}
	}
	c.running[u.Name]++
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.running[u.Name]--; c.running[u.Name] == 0 {
				delete(c.running, u.Name)
			}
		})
	}, nil
}
