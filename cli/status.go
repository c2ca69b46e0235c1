package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"fleet"
)

// StatusHub is what `status` needs from the hub.
type StatusHub interface {
	Status(ctx context.Context, u fleet.User) (fleet.HubStatus, error)
}

func statusCmd(h Hub, u fleet.User) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "status",
		Short: "one screen: the hub, router and console addresses, nodes and workers by state, models, keys",
		Args:  noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			st, err := h.Status(c.Context(), u)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(c.OutOrStdout(), st)
			}
			return printStatus(c.OutOrStdout(), st)
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func printStatus(w io.Writer, st fleet.HubStatus) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	up := "not serving yet"
	if !st.StartedAt.IsZero() {
		up = "up " + time.Duration(st.UptimeSeconds*float64(time.Second)).Round(time.Second).String()
	}
	if st.DataDir != "" {
		up += ", data in " + st.DataDir
	}
	if st.Database != "" {
		up += ", state in " + st.Database
	}
	fmt.Fprintf(tw, "hub\tfleet %s, %s\n", st.Version, up)
	if len(st.Hubs) > 0 || st.HubsError != "" {
		leader := "no hub leads: none holds the lease, so actions are refused"
		if st.Leader != "" {
			leader = "leader " + st.Leader
		}
		fmt.Fprintf(tw, "this hub\t%s, %s (%s)\n", st.Hub, st.HubRole, leader)
		var hubs []string
		for _, o := range st.Hubs {
			hubs = append(hubs, fmt.Sprintf("%s %s, heartbeat %s ago", o.Name, o.Role,
				time.Duration(o.HeartbeatAgeSeconds*float64(time.Second)).Round(100*time.Millisecond)))
		}
		if st.HubsError != "" {
			fmt.Fprintf(tw, "hubs\t%s\n", st.HubsError)
		} else {
			fmt.Fprintf(tw, "hubs\t%d: %s\n", len(st.Hubs), strings.Join(hubs, "; "))
		}
	}
	router := st.Router
	if router == "" {
		router = "not listening yet"
	}
	keys := fmt.Sprintf("%d API key", st.Keys)
	if st.Keys != 1 {
		keys += "s"
	}
	switch {
	case st.KeysError != "" && st.KeysFromMemory:
		keys += " as this hub last read them, " + st.KeysError
	case st.KeysError != "":
		keys = "API keys unknown, " + st.KeysError
	}
	if st.KeysRequired {
		keys += ", required"
	} else {
		keys += ", not required on loopback"
	}
	fmt.Fprintf(tw, "router\t%s (%s)\n", router, keys)
	switch {
	case st.Console == "":
		fmt.Fprintf(tw, "console\tnone (serve --ssh ADDR)\n")
	case st.ConsoleName != "":
		fmt.Fprintf(tw, "console\tssh %s (%s)\n", st.ConsoleName, st.Console)
	default:
		fmt.Fprintf(tw, "console\t%s\n", st.Console)
	}
	fmt.Fprintf(tw, "nodes\t%s\n", stateLine(st.Nodes, string(fleet.NodeUp)))
	if st.EnginePorts != "" {
		fmt.Fprintf(tw, "engine ports\t%s (nodes without ports: of their own; serve --engine-ports)\n", st.EnginePorts)
	}
	fmt.Fprintf(tw, "workers\t%s\n", stateLine(st.Workers, string(fleet.WorkerReady)))
	if len(st.Models) == 0 {
		fmt.Fprintf(tw, "models\tnone (place one in the fleet file: fleet apply < fleet.yaml)\n")
	}
	for i, m := range st.Models {
		label := ""
		if i == 0 {
			label = "models"
		}
		aliases := ""
		if len(m.Aliases) > 0 {
			aliases = " (" + strings.Join(m.Aliases, ", ") + ")"
		}
		fmt.Fprintf(tw, "%s\t%s%s: %d/%d workers ready, context %d\n", label, m.ID, aliases, m.Ready, m.Workers, m.Context)
	}
	return tw.Flush()
}

// stateLine is "3: 2 up, 1 unreachable (rig)": names only for states other
// than the healthy one, which are what an operator looks at.
func stateLine(cs []fleet.StateCount, healthy string) string {
	total := 0
	var parts []string
	for _, c := range cs {
		total += c.Count
		p := fmt.Sprintf("%d %s", c.Count, c.State)
		if c.State != healthy {
			names := c.Names
			if len(names) > 5 {
				names = append(slices.Clone(names[:5]), fmt.Sprintf("%d more", len(c.Names)-5))
			}
			p += " (" + strings.Join(names, ", ") + ")"
		}
		parts = append(parts, p)
	}
	if total == 0 {
		return "none"
	}
	return fmt.Sprintf("%d: %s", total, strings.Join(parts, ", "))
}
