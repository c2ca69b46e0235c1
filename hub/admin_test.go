package hub

import (
	"strings"
	"testing"
)

// A user's own console theme is one the SSH console paints: an unknown
// name is refused with the names to choose from and stores nothing; ""
// goes back to the terminal's background.
func TestSetThemeOnlyOfThemesTheConsolePaints(t *testing.T) {
	h, actors := seededHub(t)
	ctx := t.Context()
	vic := actors[viewer.Name]
	tests := []struct {
		theme, want, wantErr string
	}{
		{"light", "light", ""},
		{"neon", "light", `unknown theme "neon": choose one of dark, high-contrast, light`},
		{"", "", ""},
	}
	for _, tt := range tests {
		err := h.admin.SetTheme(ctx, vic, tt.theme)
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("SetTheme(%q): %v; want error %q", tt.theme, err, tt.wantErr)
		}
		users, err := h.store.Users(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range users {
			if u.Name == vic.Name && u.Theme != tt.want {
				t.Errorf("after SetTheme(%q) the stored theme is %q, want %q", tt.theme, u.Theme, tt.want)
			}
		}
	}
}
