// Command object-health says how the tools that judge Kubernetes objects read each object it
// is given: kstatus (sigs.k8s.io/cli-utils, what Helm 4's --wait and Flux use) and an Argo CD
// health check written in Lua, run by gopher-lua as Argo CD runs it. The tests feed it
// OutboxRelays recorded on the real control plane.
//
// Usage: object-health -argocd-health health.lua < objects.jsonl
// Reads one JSON object per line; prints one JSON line per object:
// {"kstatus":"Current","kstatusMessage":"…","argocd":"Healthy","argocdMessage":"…"}.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	lua "github.com/yuin/gopher-lua"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type verdict struct {
	Kstatus        string `json:"kstatus"`
	KstatusMessage string `json:"kstatusMessage"`
	Argocd         string `json:"argocd"`
	ArgocdMessage  string `json:"argocdMessage"`
}

func main() {
	healthScript := flag.String("argocd-health", "", "the Argo CD health check (Lua) to run on each object")
	flag.Parse()
	script, err := os.ReadFile(*healthScript)
	if err != nil {
		fail("read the Argo CD health check: %v", err)
	}
	lines := bufio.NewScanner(os.Stdin)
	lines.Buffer(make([]byte, 1<<20), 16<<20)
	out := json.NewEncoder(os.Stdout)
	for lines.Scan() {
		// Decoded as the API machinery decodes objects: integers stay int64, which kstatus'
		// accessors require.
		object := &unstructured.Unstructured{}
		if err := object.UnmarshalJSON(lines.Bytes()); err != nil {
			fail("decode an object: %v", err)
		}
		result, err := status.Compute(object)
		if err != nil {
			fail("kstatus: %v", err)
		}
		health, message, err := argocdHealth(string(script), object.Object)
		if err != nil {
			fail("the Argo CD health check: %v", err)
		}
		if err := out.Encode(verdict{string(result.Status), result.Message, health, message}); err != nil {
			fail("write: %v", err)
		}
	}
	if err := lines.Err(); err != nil {
		fail("read: %v", err)
	}
}

// argocdHealth runs the script with the object as the global `obj`, as Argo CD does, and
// returns the `status` and `message` of the table it returns.
func argocdHealth(script string, object map[string]interface{}) (string, string, error) {
	state := lua.NewState(lua.Options{SkipOpenLibs: false})
	defer state.Close()
	state.SetGlobal("obj", toLua(state, object))
	if err := state.DoString(script); err != nil {
		return "", "", err
	}
	table, ok := state.Get(-1).(*lua.LTable)
	if !ok {
		return "", "", fmt.Errorf("the script returned %s, not a table", state.Get(-1).Type())
	}
	return lua.LVAsString(table.RawGetString("status")), lua.LVAsString(table.RawGetString("message")), nil
}

// toLua turns a decoded JSON value into Lua values: objects and arrays into tables (arrays
// 1-based), numbers into numbers.
func toLua(state *lua.LState, value interface{}) lua.LValue {
	switch v := value.(type) {
	case nil:
		return lua.LNil
	case bool:
		return lua.LBool(v)
	case string:
		return lua.LString(v)
	case int64:
		return lua.LNumber(v)
	case float64:
		return lua.LNumber(v)
	case map[string]interface{}:
		table := state.NewTable()
		for key, item := range v {
			table.RawSetString(key, toLua(state, item))
		}
		return table
	case []interface{}:
		table := state.NewTable()
		for _, item := range v {
			table.Append(toLua(state, item))
		}
		return table
	default:
		return lua.LString(fmt.Sprint(v))
	}
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "object-health: "+format+"\n", args...)
	os.Exit(1)
}
