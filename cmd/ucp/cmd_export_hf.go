package main

import (
	"github.com/spf13/pflag"
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
	f.StringVar(&o.Arch, "arch", "", "hf, torch: map names to a transformers model (llama)")
	f.StringVar(&o.Params, "params", "", "hf, torch: export only the parameters whose atomic name matches this regexp")
	f.StringVar(&o.Memory, "memory", "", "hf, torch: memory budget of the writers, like 1GiB (default: a quarter of RAM, at most 1GiB)")
}
