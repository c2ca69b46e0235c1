package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"fleet/router"
	"fleet/router/simulate"
)

func simulateCmd() *cobra.Command {
	var name, file string
	var load float64
	var requests int
	var seed uint64
	var policies []string
	var asJSON bool
	c := &cobra.Command{
		Use:   "simulate",
		Short: "compare routing policies in virtual time on a scenario (the router's own scheduler code, no sleeping)",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			var s simulate.Scenario
			if file != "" {
				data, err := os.ReadFile(file)
				if err != nil {
					return fmt.Errorf("reading the scenario: %w", err)
				}
				if err := json.Unmarshal(data, &s); err != nil {
					return fmt.Errorf("%s is not a JSON scenario: %w", file, err)
				}
			} else {
				var err error
				if s, err = simulate.Builtin(name, load); err != nil {
					return fmt.Errorf("%w (built-in scenarios: %s)", err, strings.Join(simulate.Scenarios(), ", "))
				}
			}
			if c.Flags().Changed("load") {
				s.Load = load
			}
			if requests > 0 {
				s.Requests = requests
			}
			if c.Flags().Changed("seed") {
				s.Seed = seed
			}
			rs, err := simulate.Run(s, policies)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(c.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(rs)
			}
			fmt.Fprint(c.OutOrStdout(), simulate.Text(s, rs))
			return nil
		},
	}
	c.Flags().StringVar(&name, "scenario", "seed-mixed", "built-in scenario: "+strings.Join(simulate.Scenarios(), ", "))
	c.Flags().StringVar(&file, "file", "", "a scenario in JSON (the shape of --json's scenario)")
	c.Flags().Float64Var(&load, "load", 0.7, "offered load as a fraction of the fleet's capacity (agent scenarios: of the turns a second it serves when every turn reuses its conversation)")
	c.Flags().IntVar(&requests, "requests", 0, "requests to simulate (default: the scenario's)")
	c.Flags().Uint64Var(&seed, "seed", 42, "random seed of arrivals and lengths")
	c.Flags().StringSliceVar(&policies, "policies", []string{"fleet", "fleet-no-prefix", "p2c-least-loaded", "round-robin", "random", "session-sticky", "cache-aware"}, "policies to compare, any of: "+strings.Join(router.PolicyNames, ", "))
	c.Flags().BoolVar(&asJSON, "json", false, "print a JSON list of results")
	return c
}
