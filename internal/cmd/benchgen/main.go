// Command benchgen writes the large DeepSpeed checkpoint that 'make bench'
// converts: a generator imitating DeepSpeed's layout (benchgen.go), not
// DeepSpeed itself, so it only feeds benchmarks, never truth.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"
)

func main() {
	c := Default
	out := flag.String("out", ".bench/src", "folder to write the checkpoint into")
	flag.IntVar(&c.Hidden, "hidden", c.Hidden, "hidden size")
	flag.IntVar(&c.Layers, "layers", c.Layers, "transformer layers")
	flag.IntVar(&c.TP, "tp", c.TP, "tensor parallel degree")
	flag.IntVar(&c.DP, "dp", c.DP, "data parallel degree")
	flag.BoolVar(&c.Zero3, "zero3", false, "write ZeRO-3 (bf16, TP 1) instead of ZeRO-2 with TP")
	flag.BoolVar(&c.Llama, "llama", false, "Megatron-DeepSpeed's Llama layout with its training arguments (a model family reshard --to megatron knows)")
	flag.Parse()
	if c.Zero3 && !flagSet("tp") {
		c.TP = 1
	}
	start := time.Now()
	if err := Generate(*out, c); err != nil {
		fmt.Fprintln(os.Stderr, "benchgen:", err)
		os.Exit(1)
	}
	kind := "ZeRO-2"
	if c.Zero3 {
		kind = "ZeRO-3"
	}
	if c.Llama {
		kind += " Llama"
	}
	fmt.Printf("wrote %d parameters (%s, hidden %d, %d layers, TP %d x DP %d) to %s in %.1fs\n",
		c.Params(), kind, c.Hidden, c.Layers, c.TP, c.DP, *out, time.Since(start).Seconds())
}

func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
