package testkit

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Torch2Script is the script that builds and enters the Debian 13 chroot with
// real torch 2.x and the safetensors package.
func Torch2Script() string { return filepath.Join(RepoRoot(), "scripts", "torch2-chroot.sh") }

// Torch2Ready reports whether the torch 2.x chroot is built and usable (root
// is needed to enter it). The reason says what is missing.
func Torch2Ready() (bool, string) {
	if os.Getuid() != 0 {
		return false, "entering the torch 2.x chroot needs root"
	}
	out, err := exec.Command(Torch2Script(), "path").Output()
	if err != nil {
		return false, "scripts/torch2-chroot.sh path: " + err.Error()
	}
	root := strings.TrimSpace(string(out))
	if _, err := os.Stat(filepath.Join(root, ".ucp-complete")); err != nil {
		return false, "the torch 2.x chroot is not built (run scripts/torch2-chroot.sh build)"
	}
	return true, ""
}

// Torch2 runs the Python file script with real torch 2.x inside the chroot
// of scripts/torch2-chroot.sh. dir is mounted at /work and is the working
// folder, so args name files relative to dir; the script is copied there
// first, with its private modules (_*.py beside it). Without the chroot
// the test is skipped, unless UCP_REQUIRE_TORCH2=1 (CI), when it fails. A
// non-zero exit fails the test with the output; the output is returned.
func Torch2(tb testing.TB, dir, script string, args ...string) string {
	tb.Helper()
	if ok, why := Torch2Ready(); !ok {
		if os.Getenv("UCP_REQUIRE_TORCH2") == "1" {
			tb.Fatalf("UCP_REQUIRE_TORCH2=1 but %s", why)
		}
		tb.Skipf("%s; skipping the real torch 2.x check", why)
	}
	src, err := os.ReadFile(script)
	if err != nil {
		tb.Fatal(err)
	}
	name := ".ucp-check-" + filepath.Base(script)
	if err := os.WriteFile(filepath.Join(dir, name), src, 0o644); err != nil {
		tb.Fatal(err)
	}
	// The script's private modules (_*.py beside it) go with it.
	mods, _ := filepath.Glob(filepath.Join(filepath.Dir(script), "_*.py"))
	for _, m := range mods {
		b, err := os.ReadFile(m)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, filepath.Base(m)), b, 0o644)
		}
		if err != nil {
			tb.Fatal(err)
		}
	}
	cmd := exec.Command(Torch2Script(), append([]string{"run", dir, "python3", name}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		tb.Fatalf("torch 2.x check %s failed: %v\n%s", filepath.Base(script), err, strings.TrimSpace(string(out)))
	}
	return string(out)
}
