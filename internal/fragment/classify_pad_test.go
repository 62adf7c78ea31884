package fragment

import (
	"testing"
)

// A vocabulary padded to 256 rows over 2 ranks whose true size is 100:
// rank 1 holds only padding, and the parameter is still Shard-V.
func TestClassifyAllPaddingShard(t *testing.T) {
	padded := []int64{256, 4}
	p := &Param{Shape: []int64{100, 4}, Info: Info{VocabSize: 100, PaddedVocab: 256}}
	st := p.AddState(FP32)
	for r := 0; r < 2; r++ {
		s, err := Split{Dim: 0}.Shard(padded, r, 2)
		if err != nil {
			t.Fatal(err)
		}
		st.Shards = append(st.Shards, StripPad(s, padded, 0, 100))
	}
	if k, dims := Classify(p); k != ShardV || len(dims) != 1 || dims[0] != 0 {
		t.Fatalf("Classify = %v %v, want Shard-V [0]", k, dims)
	}
}
