package layout

import "fmt"

// Piece says that elements [Local, Local+N) of parameter Param (its
// tensor-parallel shard, flattened) go to element At of a rank's flat
// partition.
type Piece struct {
	Param int
	Local int64
	N     int64
	At    int64
}

// Zero12Pieces lays out one ZeRO-1/2 parameter group over D ranks as
// DeepSpeed does (formats/deepspeed/FORMAT.md, "Partitions"): the group's shards flattened in
// order, padded at the end to a multiple of 2*D, split evenly. It returns
// rank r's pieces and the partition size; the rest of the partition is
// padding (zeros).
func Zero12Pieces(numels []int64, D, r int) ([]Piece, int64, error) {
	if D <= 0 || r < 0 || r >= D {
		return nil, 0, fmt.Errorf("rank %d of %d", r, D)
	}
	var total int64
	for _, n := range numels {
		total += n
	}
	align := int64(2 * D)
	S := (total + align - 1) / align * align / int64(D)
	lo, hi := int64(r)*S, int64(r+1)*S
	var out []Piece
	var off int64
	for i, n := range numels {
		if fs, fe := max(off, lo), min(off+n, hi); fs < fe {
			out = append(out, Piece{Param: i, Local: fs - off, N: fe - fs, At: fs - lo})
		}
		off += n
	}
	return out, S, nil
}

// Zero3Pieces lays out one ZeRO-3 sub-group over D ranks
// (formats/deepspeed/ZERO3.md, "Partitions"): each parameter on its own, padded to D*ceil(n/D) and split
// evenly, rank r's parts concatenated. It returns rank r's pieces and the
// partition size; each parameter's padding stays zero.
func Zero3Pieces(numels []int64, D, r int) ([]Piece, int64, error) {
	if D <= 0 || r < 0 || r >= D {
		return nil, 0, fmt.Errorf("rank %d of %d", r, D)
	}
	var out []Piece
	var at int64
	for i, n := range numels {
		pn := (n + int64(D) - 1) / int64(D)
		if valid := max(0, min(pn, n-int64(r)*pn)); valid > 0 {
			out = append(out, Piece{Param: i, Local: int64(r) * pn, N: valid, At: at})
		}
		at += pn
	}
	return out, at, nil
}

// Fill builds a flat partition of size elements from its pieces, reading
// each with read (into a slice of exactly N elements).
func Fill(size int64, pieces []Piece, read func(p Piece, dst []float32) error) ([]float32, error) {
	part := make([]float32, size)
	for _, p := range pieces {
		if p.At < 0 || p.At+p.N > size {
			return nil, fmt.Errorf("piece at %d of %d elements outside a partition of %d", p.At, p.N, size)
		}
		if err := read(p, part[p.At:p.At+p.N]); err != nil {
			return nil, err
		}
	}
	return part, nil
}
