package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/ucp-project/ucp/internal/atomic"
)

// isAtomic says whether dir is a finished atomic checkpoint: its manifest,
// written last, is there.
func isAtomic(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, atomic.ManifestName))
	return err == nil
}

// inspectAtomic prints an atomic checkpoint from its manifest alone; no
// tensor file is opened (ucp verify reads them).
func inspectAtomic(out io.Writer, dir string, asJSON bool) error {
	m, err := atomic.ReadManifest(dir)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(out, m)
	}
	files := m.AllFiles()
	var bytes int64
	for _, f := range files {
		bytes += f.Bytes
	}
	d := m.Source.Degrees
	fmt.Fprintf(out, "%s: atomic checkpoint (version %d), %d parameters, %s\n", dir, m.Version, len(m.Params), filesLine(dir, len(files), bytes))
	fmt.Fprintf(out, "converted from %s %s", m.Source.Format, m.Source.Path)
	if m.Source.Tag != "" {
		fmt.Fprintf(out, " (tag %s)", m.Source.Tag)
	}
	fmt.Fprintf(out, ": TP %d  PP %d  DP %d", d.TP, d.PP, d.DP)
	if d.EP > 1 {
		fmt.Fprintf(out, "  EP %d", d.EP)
	}
	if d.ZeRO > 0 {
		fmt.Fprintf(out, "  ZeRO-%d", d.ZeRO)
	}
	if m.Source.DType != "" {
		fmt.Fprintf(out, "  trained in %s", m.Source.DType)
	}
	// DTYPE is the dtype of the atomic state files: float32 master
	// weights and moments whatever the training dtype (a bf16 run's
	// fp32.pt is float32); frozen parameters and buffers keep theirs.
	fmt.Fprint(out, "\nDTYPE: the dtype of the state files here (training states are float32; frozen parameters and buffers keep their own)\n\n")
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PARAMETER\tPATTERN\tSHAPE\tDTYPE\tSTATES")
	for _, p := range m.Params {
		name := escapeControl(p.Name)
		if p.Frozen {
			name += " (frozen)"
		}
		if p.VocabSize > 0 {
			name += fmt.Sprintf(" (vocab %d of %d)", p.VocabSize, p.PaddedVocab)
		}
		states := make([]string, len(p.Files))
		for i, f := range p.Files {
			states[i] = f.State
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%s\n", name, p.Pattern, p.Shape, p.DType, strings.Join(states, ","))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range m.Notes {
		fmt.Fprintln(out, "note:", n)
	}
	return nil
}
