package main

import (
	"github.com/spf13/cobra"
)

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "ucp",
		Short: "Universal checkpoints: make training checkpoints independent of their parallelism",
		Long: `ucp converts distributed training checkpoints into atomic checkpoints: one
consolidated float32 tensor per parameter and optimizer state, in DeepSpeed's
universal checkpoint layout (zero/<param>/fp32.pt, exp_avg.pt, exp_avg_sq.pt,
step.pt) with a manifest (ucp.json). Any target parallelism can load them.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	// An unknown or malformed flag gets the usage line and an example too.
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error { return usageError(cmd, err) })
	root.AddCommand(
		newConvertCommand(),
		newDiffCommand(),
		newExportCommand(),
		newReshardCommand(),
		newInspectCommand(),
		newVerifyCommand(),
		newVersionCommand(),
	)
	return root
}
