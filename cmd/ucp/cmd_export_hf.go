package main

import (
	"strings"

	"github.com/spf13/pflag"

	"github.com/ucp-project/ucp/internal/family"
)

// hfOptions are the flags of export --to hf / --to torch.
type hfOptions struct {
	MaxShard string
	Arch     string
	Params   string
	Memory   string
}

func addHFFlags(f *pflag.FlagSet, o *hfOptions) {
	f.StringVar(&o.MaxShard, "max-shard-size", "5GB", "hf, torch: largest file, as Hugging Face parses it (5GB = 5e9 bytes, 5GiB = 5*2^30)")
	f.StringVar(&o.Arch, "arch", "auto", "hf, torch: map names to a transformers model: auto (the family the checkpoint records; hf's default), "+strings.Join(family.Names(), ", ")+", or none (the source's names, no config.json; torch's default)")
	f.StringVar(&o.Params, "params", "", "hf, torch: export only the parameters whose atomic name matches this regexp")
	f.StringVar(&o.Memory, "memory", "", "hf, torch: memory budget of the writers, like 1GiB (default: a quarter of RAM, at most 1GiB)")
}
