package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"sync"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/ucp-project/ucp/atomic"
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
with the manifest. Every mismatch is reported; the exit code is non-zero if
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
	files := m.AllFiles()
	var mu sync.Mutex
	var bad []string
	var total int64
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(max(opts.Workers, 1))
	for _, f := range files {
		g.Go(func() error {
			if err := ctx.Err(); err != nil {
				return err
			}
			err := atomic.VerifyFile(filepath.Join(dir, filepath.FromSlash(f.Path)), f)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				bad = append(bad, err.Error())
			} else {
				total += f.Bytes
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	sort.Strings(bad)
	for _, b := range bad {
		fmt.Fprintln(out, "BAD", b)
	}
	if len(bad) > 0 {
		return fmt.Errorf("%s: %d of %d files do not match the manifest", dir, len(bad), len(files))
	}
	fmt.Fprintf(out, "%s: %d files, %s, all match the manifest\n", dir, len(files), humanBytes(total))
	return nil
}
