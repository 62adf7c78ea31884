package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/formats"
)

// checkPath fails with what to do when path does not exist, before any
// format tries it and fails with a vaguer message.
func checkPath(path string) error {
	_, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: no such file or folder (give the checkpoint's folder: the one with 'latest', a tag folder, an iter_* folder or a .metadata folder)", path)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// escapeControl quotes names holding control or invalid characters, so
// that a hostile checkpoint cannot move the terminal's cursor.
func escapeControl(s string) string {
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == '\uFFFD' {
			q := strconv.Quote(s)
			return q[1 : len(q)-1]
		}
	}
	return s
}

// exactArgs is cobra.ExactArgs with the usage line and one example added,
// and the usual cause of a wrong count named: a bool flag given its value
// after a space (--check-replicas false) leaves the value as an extra
// argument.
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) == n {
			return nil
		}
		for _, a := range args {
			if a == "true" || a == "false" {
				return usageError(cmd, fmt.Errorf("%s takes %d argument(s) but got %d (%s): bool flags take their value with '=', like --check-replicas=false",
					cmd.Name(), n, len(args), strings.Join(args, " ")))
			}
		}
		if len(args) == 0 {
			return usageError(cmd, fmt.Errorf("%s needs %d argument(s), got none", cmd.Name(), n))
		}
		return usageError(cmd, fmt.Errorf("%s takes %d argument(s) but got %d (%s)", cmd.Name(), n, len(args), strings.Join(args, " ")))
	}
}

// usageError adds to err what git and restic print on a wrong command
// line: the usage line, one example, and where the rest is; exit status 2,
// as for any command-line mistake.
func usageError(cmd *cobra.Command, err error) error {
	msg := err.Error() + "\nusage: " + cmd.UseLine()
	if ex, _, _ := strings.Cut(strings.TrimSpace(cmd.Example), "\n"); ex != "" {
		msg += "\nexample: " + strings.TrimSpace(ex)
	}
	return &exitError{2, fmt.Errorf("%s\n'ucp help %s' lists the flags and more examples", msg, cmd.Name())}
}

// sourceCheck refuses what convert cannot start from, saying what to do
// instead: a missing path, or an atomic checkpoint (already converted).
func sourceCheck(src, from string) error {
	if err := checkPath(src); err != nil {
		return err
	}
	if from == "" && isAtomic(src) {
		return fmt.Errorf("%s is already an atomic checkpoint (it has %s): 'ucp export' writes other formats from it, 'ucp verify' checks it, 'ucp inspect' shows it",
			src, atomic.ManifestName)
	}
	return nil
}

// sourceError rewrites a reader's error into what to do where ucp can tell
// more: a --tag that does not exist lists the tags that do.
func sourceError(src, tag string, err error) error {
	if tag == "" {
		return err
	}
	dir := src
	if st, serr := os.Stat(filepath.Join(src, tag)); serr == nil && st.IsDir() {
		return err
	}
	if n, perr := strconv.Atoi(tag); perr == nil {
		if _, serr := os.Stat(filepath.Join(dir, fmt.Sprintf("iter_%07d", n))); serr == nil {
			return err
		}
	}
	ents, rerr := os.ReadDir(dir)
	if rerr != nil {
		return err
	}
	var tags []string
	for _, e := range ents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			tags = append(tags, e.Name())
		}
	}
	if len(tags) == 0 {
		return fmt.Errorf("%s: --tag %s: the folder has no tag folders (give the save folder that holds them)", src, tag)
	}
	return fmt.Errorf("%s: there is no tag %s; the tags here are: %s", src, tag, strings.Join(tags, ", "))
}

// atomicCheck says what to do when a command that reads an atomic
// checkpoint (verify, export) is given another folder.
func atomicCheck(dir string) error {
	if err := checkPath(dir); err != nil {
		return err
	}
	if isAtomic(dir) {
		return nil
	}
	if _, err := os.Stat(dir + ".partial"); err == nil {
		return fmt.Errorf("%s is not finished: %s.partial holds a conversion that was interrupted or is still running; run 'ucp convert' again",
			dir, filepath.Base(dir))
	}
	if f, err := formats.Detect(dir); err == nil {
		return fmt.Errorf("%s is a %s checkpoint, not an atomic one: convert it first with 'ucp convert %s OUT' and give OUT", dir, f.Name, dir)
	}
	return fmt.Errorf("%s is not an atomic checkpoint (it has no %s): give the folder 'ucp convert' wrote", dir, atomic.ManifestName)
}

// fileCheck explains files inspect cannot show on their own.
func fileCheck(path string) error {
	if strings.HasSuffix(path, ".distcp") {
		return fmt.Errorf("%s is a data file of a PyTorch Distributed Checkpoint; its tensors are described by the folder's .metadata: run 'ucp inspect %s'",
			path, filepath.Dir(path))
	}
	return nil
}

// exitMessage is what main prints for err, and its exit status: an
// interruption says that nothing was written (the runs remove their
// partial output), diff's statuses pass through.
func exitMessage(ctx context.Context, err error) (string, int) {
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return "ucp: interrupted, nothing written", 130
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return "ucp: " + err.Error(), ee.code
	}
	return "ucp: " + err.Error(), 1
}
