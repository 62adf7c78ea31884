package hf

import (
	"fmt"
	"strconv"
	"strings"
)

// DefaultMaxShard is transformers' default max_shard_size ("5GB").
const DefaultMaxShard = 5_000_000_000

// ParseSize reads a shard size as huggingface_hub's
// convert_file_size_to_int does: an integer number of bytes, or an integer
// with GiB/MiB/KiB (powers of 2) or GB/MB/KB (powers of 10) in any case;
// a lower-case final b (Gb, Mb, Kb) means bits.
func ParseSize(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"GIB", 1 << 30}, {"MIB", 1 << 20}, {"KIB", 1 << 10}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}}
	mult, num, bits := int64(1), s, false
	for _, u := range units {
		if strings.HasSuffix(strings.ToUpper(s), u.suffix) {
			mult, num = u.mult, s[:len(s)-len(u.suffix)]
			bits = len(u.suffix) == 2 && strings.HasSuffix(s, "b")
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("%q is not a shard size (a positive integer with GB, MB, KB, GiB, MiB or KiB, like 5GB)", s)
	}
	n *= mult
	if bits {
		n /= 8
	}
	return n, nil
}
