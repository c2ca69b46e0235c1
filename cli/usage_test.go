package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"fleet"
)

func TestUsageCommand(t *testing.T) {
	viewer := fleet.User{Name: "v", Role: fleet.RoleViewer}
	admin := fleet.User{Name: "ad", Role: fleet.RoleAdmin}
	for _, tc := range []struct {
		name      string
		u         fleet.User
		args      []string
		code      int
		out, err  string
		wantSince time.Duration
		wantBy    string
	}{
		{"default: a day by model", viewer, []string{"usage"}, ExitOK, "PROMPT", "", 24 * time.Hour, "model"},
		{"by key, a week", admin, []string{"usage", "--by", "key", "--since", "7d"}, ExitOK, "1000 (83%)", "", 7 * 24 * time.Hour, "key"},
		{"json", viewer, []string{"usage", "--json", "--since", "90m"}, ExitOK, `"prompt_tokens": 1200`, "", 90 * time.Minute, "model"},
		{"a bad span is usage", viewer, []string{"usage", "--since", "yesterday"}, ExitUsage, "", "not a time span", 0, ""},
		{"a bad grouping is usage", viewer, []string{"usage", "--by", "colour"}, ExitUsage, "", "key, model or worker", 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &fakeHub{}
			var out, errb bytes.Buffer
			before := time.Now()
			code := Run(context.Background(), h, tc.u, tc.args, strings.NewReader(""), &out, &errb)
			if code != tc.code || !strings.Contains(out.String(), tc.out) || !strings.Contains(errb.String(), tc.err) {
				t.Fatalf("exit %d (want %d)\nstdout %s\nstderr %s", code, tc.code, out.String(), errb.String())
			}
			if tc.code != ExitOK {
				if h.usageBy != "" {
					t.Error("a refused command asked the hub")
				}
				return
			}
			if h.usageBy != tc.wantBy || h.usageSince.Before(before.Add(-tc.wantSince)) || h.usageSince.After(before.Add(-tc.wantSince+time.Minute)) {
				t.Errorf("asked the hub for usage by %q since %v, want by %q since %v ago", h.usageBy, h.usageSince, tc.wantBy, tc.wantSince)
			}
		})
	}
}

func TestKeyLimitCommand(t *testing.T) {
	admin := fleet.User{Name: "ad", Role: fleet.RoleAdmin}
	operator := fleet.User{Name: "op", Role: fleet.RoleOperator}
	h := &fakeHub{}
	var out, errb bytes.Buffer
	if code := Run(context.Background(), h, admin, []string{"key", "limit", "ci", "--rpm", "60", "--tokens-per-day", "100000"}, nil, &out, &errb); code != ExitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if len(h.limits) != 1 || h.limits[0] != "ci 60 100000" || !strings.Contains(out.String(), "60 requests a minute, 100000 tokens a day") {
		t.Errorf("limits set %v, printed %q", h.limits, out.String())
	}
	if errb.Len() > 0 {
		t.Errorf("a limit a router that checks keys will apply: stderr %q", errb.String())
	}
	// Where the router checks no key, setting a limit says it holds nothing.
	h.keysNotChecked = "the router checks no key"
	if code := Run(context.Background(), h, admin, []string{"key", "limit", "ci", "--rpm", "60"}, nil, &out, &errb); code != ExitOK ||
		!strings.Contains(errb.String(), "holds nothing now: the router checks no key") {
		t.Errorf("a limit a router without keys ignores: exit %d, stderr %q", code, errb.String())
	}
	h.limits = h.limits[:1]
	errb.Reset()
	if code := Run(context.Background(), h, admin, []string{"key", "limit", "ci", "--rpm", "-1"}, nil, &out, &errb); code != ExitUsage || !strings.Contains(errb.String(), "negative") {
		t.Errorf("a negative limit: exit %d %s", code, errb.String())
	}
	errb.Reset()
	if code := Run(context.Background(), h, operator, []string{"key", "limit", "ci", "--rpm", "5"}, nil, &out, &errb); code != ExitFail || !strings.Contains(errb.String(), "admin") {
		t.Errorf("an operator setting limits: exit %d %s", code, errb.String())
	}
	if len(h.limits) != 1 {
		t.Errorf("refused commands set limits: %v", h.limits)
	}
}

// `key list` shows which keys are in use: when each was last used and its
// requests today, "-" for a key never used.
func TestKeyListShowsUse(t *testing.T) {
	created := time.Date(2026, 11, 1, 9, 0, 0, 0, time.Local)
	h := &fakeHub{keys: []fleet.APIKey{
		{Name: "ci", Created: created, LastUsed: time.Date(2026, 11, 30, 14, 5, 0, 0, time.Local), RequestsToday: 1234, KeyLimits: fleet.KeyLimits{TokensPerDay: 2000}},
		{Name: "idle", Created: created},
	}}
	root := newRoot(h, fleet.User{Name: "ad", Role: fleet.RoleAdmin}, nil)
	var out bytes.Buffer
	root.SetArgs([]string{"key", "list"})
	root.SetOut(&out)
	root.SetErr(&bytes.Buffer{})
	if err := root.ExecuteContext(t.Context()); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "LAST USED") || !strings.Contains(lines[0], "REQUESTS TODAY") {
		t.Fatalf("key list:\n%s\nwant a header with LAST USED and REQUESTS TODAY and a line per key", out.String())
	}
	if f := strings.Fields(lines[1]); len(f) != 9 || f[4] != "2026-11-30" || f[5] != "14:05" || f[6] != "1234" {
		t.Errorf("ci's line %q, want last used 2026-11-30 14:05 and 1234 requests today", lines[1])
	}
	if f := strings.Fields(lines[2]); len(f) != 8 || f[4] != "-" || f[5] != "0" {
		t.Errorf("idle's line %q, want last used - and 0 requests today", lines[2])
	}
}
