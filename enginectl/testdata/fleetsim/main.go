// Command fleetsim is `fleet sim` without the rest of the fleet command: it
// lets enginectl's tests launch the real simulator exactly as a simulated
// node does (`FLEETBIN sim --mimic … --profile … -- ENGINE ARGS`) while the
// other packages of cmd/fleet are still being written.
package main

import (
	"context"
	"fmt"
	"os"

	"fleet/sim"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != "sim" {
		fmt.Fprintln(os.Stderr, "usage: fleetsim sim --mimic vllm|llamacpp --profile NAME [-- ENGINE ARGS]")
		os.Exit(2)
	}
	if err := sim.Main(context.Background(), os.Args[2:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
