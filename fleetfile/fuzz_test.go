package fleetfile

import (
	"reflect"
	"testing"
)

// FuzzParse checks that no input makes Parse panic, and that whatever Parse
// accepts survives Marshal and a second Parse unchanged.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		string(Demo),
		designExample,
		validBase,
		"",
		"nodes: [\n",
		"- a\n",
		"nodes:\n  - name: Rig\n    address: nobody\n",
		"models:\n  - id: m\n    context: lots\n",
		"a: &x [*x]\n",
		"nodes: !!seq []\n",
		"placements:\n  - model: m\n    nodes: {a: b}\n",
		"nodes:\n  - {name: a, address: \"ops@[::1]:22\"}\nmodels: []\n",
		"models:\n  - id: m\n    context: 1\n    recipes: {sim: {}, vllm: {model: \"x\\ty\", args: [\"\\u2028\", '#']}}\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		parsed, err := Parse("fuzz.yaml", data)
		if err != nil {
			return
		}
		out, err := Marshal(parsed)
		if err != nil {
			t.Fatalf("Marshal of a parsed fleet failed: %v\ninput:\n%s", err, data)
		}
		back, err := Parse("export.yaml", out)
		if err != nil {
			t.Fatalf("export does not parse: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(back, parsed) {
			t.Fatalf("round trip changed the fleet:\n got %+v\nwant %+v\nexport:\n%s", back, parsed, out)
		}
	})
}
