package layout

import "testing"

// TestByFileTake takes tasks of three files as two workers do: while two
// files have tasks left, no two workers write the same one, a worker
// stays on its file when that costs nothing, and every task is taken
// once, each file's in order.
func TestByFileTake(t *testing.T) {
	var jobs []fillTask
	for k, n := range []int{3, 1, 4} {
		for j := range n {
			jobs = append(jobs, fillTask{i: k, at: int64(j)})
		}
	}
	q := newByFile(jobs, fileOfIndex{})
	next := map[int]int64{}
	var file [2]int
	for w := range file {
		var tk fillTask
		var ok bool
		if tk, file[w], ok = q.take(-1); !ok {
			t.Fatal("no task for a fresh worker")
		}
		next[tk.i]++
	}
	if file[0] == file[1] {
		t.Fatalf("both workers start on file %d", file[0])
	}
	taken := 2
	for w := 0; ; w ^= 1 {
		prev := file[w]
		tk, k, ok := q.take(prev)
		if !ok {
			break
		}
		if tk.i != k || tk.at != next[k] {
			t.Fatalf("took task %d of file %d from queue %d, want task %d", tk.at, tk.i, k, next[k])
		}
		next[k]++
		taken++
		if k == file[w^1] && len(q.q[prev]) > 0 {
			t.Fatalf("worker %d left file %d (tasks left) for file %d, which the other writes", w, prev, k)
		}
		file[w] = k
	}
	if taken != len(jobs) {
		t.Fatalf("%d tasks taken of %d", taken, len(jobs))
	}
}

// fileOfIndex puts tensor i in file i.
type fileOfIndex struct{ Sink }

func (fileOfIndex) FileOf(i int) int { return i }
