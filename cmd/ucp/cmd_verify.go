package main

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/spf13/cobra"
	"github.com/ucp-project/ucp/internal/atomic"
)

type verifyOptions struct {
	Workers int
}

func newVerifyCommand() *cobra.Command {
	var opts verifyOptions
	cmd := &cobra.Command{
		Use:   "verify ATOMIC",
		Short: "Check every file of an atomic checkpoint against its manifest",
		Long: `Read every file that ATOMIC/ucp.json lists and compare its size and CRC-32
with the manifest. Manifest paths that would lead outside ATOMIC are not
opened, and files or zero/<param> folders the manifest does not list are
reported (UNLISTED). Every problem is reported; the exit code is non-zero if
there is any.`,
		Example: `  ucp verify checkpoints/global_step1000_universal`,
		Args:    exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runVerify(cmd.Context(), cmd.OutOrStdout(), args[0], opts)
		},
	}
	cmd.Flags().IntVar(&opts.Workers, "workers", 4, "files checked at once")
	return cmd
}

func runVerify(ctx context.Context, out io.Writer, dir string, opts verifyOptions) error {
	if err := atomicCheck(dir); err != nil {
		return err
	}
	m, err := atomic.ReadManifest(dir)
	if err != nil {
		return err
	}
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	files := m.AllFiles()
	// State files' headers are checked against their parameter's entry.
	states := map[string]*atomic.ParamEntry{}
	for i := range m.Params {
		for _, f := range m.Params[i].Files {
			if f.State != atomic.StepState {
				states[f.Path] = &m.Params[i]
			}
		}
	}
	var mu sync.Mutex
	var bad []string
	var total int64
	report := func(f atomic.FileEntry, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			bad = append(bad, err.Error())
		} else {
			total += f.Bytes
		}
	}
	// Paths are checked first; the files that pass are hashed by the
	// workers together (a big file is shared among them).
	var paths []string
	var entries []atomic.FileEntry
	for _, f := range files {
		path := filepath.Join(dir, filepath.FromSlash(f.Path))
		err := atomic.CheckPath(dir, f.Path)
		if err == nil {
			err = insideRoot(root, path)
		}
		if err != nil {
			report(f, err)
			continue
		}
		paths = append(paths, path)
		entries = append(entries, f)
	}
	err = atomic.VerifyFiles(ctx, paths, entries, opts.Workers, func(i int, err error) {
		if p := states[entries[i].Path]; err == nil && p != nil {
			err = checkStateHeader(paths[i], p)
		}
		report(entries[i], err)
	})
	if err != nil {
		return err
	}
	unlisted, err := unlistedEntries(dir, m)
	if err != nil {
		return err
	}
	sort.Strings(bad)
	for _, b := range bad {
		fmt.Fprintln(out, "BAD", b)
	}
	for _, u := range unlisted {
		fmt.Fprintln(out, "UNLISTED", u)
	}
	switch {
	case len(bad) > 0 && len(unlisted) > 0:
		return fmt.Errorf("%s: %d of %d files do not match the manifest, and %d entries are not in it", dir, len(bad), len(files), len(unlisted))
	case len(bad) > 0:
		return fmt.Errorf("%s: %d of %d files do not match the manifest", dir, len(bad), len(files))
	case len(unlisted) > 0:
		return fmt.Errorf("%s: %d files or folders are not in the manifest (left from another run, or added by hand?)", dir, len(unlisted))
	}
	fmt.Fprintf(out, "%s: %s; the listed files all match the manifest\n", dir, filesLine(dir, len(files), total))
	return nil
}

// checkStateHeader checks a state file's tensor header (dtype, shape,
// storage size) against the manifest: the CRC only proves the file is the
// one the manifest lists, not that the manifest describes it.
func checkStateHeader(path string, p *atomic.ParamEntry) error {
	f, _, err := atomic.OpenStateFile(path, p)
	if err != nil {
		return err
	}
	return f.Close()
}

// insideRoot refuses a file whose real path (symbolic links resolved)
// leaves the checkpoint folder root.
func insideRoot(root, path string) error {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return err
	}
	if rel, err := filepath.Rel(root, real); err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return fmt.Errorf("%s: leads outside the checkpoint, to %s", path, real)
	}
	return nil
}

// unlistedEntries lists, relative to dir, the files the manifest does not
// name and the zero/<param> folders of parameters it does not have: the
// checkpoint would not be what the manifest says.
func unlistedEntries(dir string, m *atomic.Manifest) ([]string, error) {
	listed := map[string]bool{atomic.ManifestName: true}
	for _, f := range m.AllFiles() {
		listed[f.Path] = true
	}
	params := map[string]bool{}
	for _, p := range m.Params {
		params[p.Name] = true
	}
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if parent, name := path.Split(rel); parent == atomic.ZeroDir+"/" && !params[name] {
				out = append(out, escapeControl(rel)+"/ (no such parameter in the manifest)")
				return fs.SkipDir
			}
			return nil
		}
		if !listed[rel] {
			out = append(out, escapeControl(rel))
		}
		return nil
	})
	sort.Strings(out)
	return out, err
}

// filesLine counts an atomic checkpoint's files as ls and du see them: the
// n files the manifest lists (bytes in all) and the manifest itself.
func filesLine(dir string, n int, bytes int64) string {
	st, err := os.Stat(filepath.Join(dir, atomic.ManifestName))
	if err != nil {
		return fmt.Sprintf("%d files, %s", n, humanBytes(bytes))
	}
	return fmt.Sprintf("%d files, %s: %d listed in %s (%s) and %s itself (%s)", n+1, humanBytes(bytes+st.Size()),
		n, atomic.ManifestName, humanBytes(bytes), atomic.ManifestName, humanBytes(st.Size()))
}
