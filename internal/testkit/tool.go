package testkit

import (
	"os"
	"os/exec"
	"testing"
)

// Tool returns the path of an external program a test checks its output
// with (rsvg-convert, node), installed by scripts/deps.sh. Without it the
// test is skipped, unless CI=true or UCP_REQUIRE_TOOLS=1, when it fails.
func Tool(tb testing.TB, name, why string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "true" || os.Getenv("UCP_REQUIRE_TOOLS") == "1" {
			tb.Fatalf("%s is required in CI (scripts/deps.sh installs it) but: %v", name, err)
		}
		tb.Skipf("%s not found (scripts/deps.sh installs it); skipping %s", name, why)
	}
	return p
}
