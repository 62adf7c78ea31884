// Command benchgen writes the large DeepSpeed checkpoint that 'make bench'
// converts (see internal/benchgen).
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/ucp-project/ucp/internal/benchgen"
)

func main() {
	c := benchgen.Default
	out := flag.String("out", ".bench/src", "folder to write the checkpoint into")
	flag.IntVar(&c.Hidden, "hidden", c.Hidden, "hidden size")
	flag.IntVar(&c.Layers, "layers", c.Layers, "transformer layers")
	flag.IntVar(&c.TP, "tp", c.TP, "tensor parallel degree")
	flag.IntVar(&c.DP, "dp", c.DP, "data parallel degree")
	flag.Parse()
	start := time.Now()
	if err := benchgen.Generate(*out, c); err != nil {
		fmt.Fprintln(os.Stderr, "benchgen:", err)
		os.Exit(1)
	}
	fmt.Printf("wrote %d parameters (hidden %d, %d layers, TP %d x DP %d) to %s in %.1fs\n",
		c.Params(), c.Hidden, c.Layers, c.TP, c.DP, *out, time.Since(start).Seconds())
}
