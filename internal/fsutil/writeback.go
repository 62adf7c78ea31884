package fsutil

// writebackWindow gathers small writes for StartWriteback. Each
// sync_file_range submits its range as block requests at once, and on a
// virtual disk every submission is an exit to the host: a file written in
// 128 KiB pieces (a conversion's output: bfloat16 weights, a safetensors
// export) cost a request and an exit per piece. 1 MiB is the largest
// request this disk takes from 4 KiB pages (254 segments), and the most a
// file's tail waits for the final sync.
//
// Measured on Linux 6.18 (ext4 on virtio, 2 cores, a VM at a load of 9-11;
// perf stat, best of 3 alternated, block:block_rq_issue in the process):
// ucp export --to hf of the real DeepSpeed checkpoint's atomic conversion
// (1 GB of fp32 read, 506 MB of bfloat16 written, synced): 4092-6442
// requests and 1.43 s of CPU before, 565-837 and 1.19 s with 1 MiB
// windows (234-500 and 1.15 s with 4 MiB); reshard --to deepspeed --zero 1
// --dp 3 of the generated 2.8 GB checkpoint: 3.43 s before, 2.86 s after
// (2.48 s with 4 MiB, whose tails of up to 4 MiB per file a convert of many
// files would leave to its final sync).
const writebackWindow = 1 << 20

// writebackRange is the range StartWriteback starts for a write of
// [off, off+n) (none when hi <= lo): a write of a window or more, all of
// it; a smaller one, the windows it completes, once its end reaches or
// crosses a multiple of the window. Both start from the window before the
// write's too, whose pages another writer of the file may have finished
// since (pages already clean or in flight cost a lookup). The bytes past
// a file's last multiple of the window are left to the final sync.
func writebackRange(off, n int64) (lo, hi int64) {
	const w = writebackWindow
	if n <= 0 || off < 0 {
		return 0, 0
	}
	start := off &^ (w - 1)
	lo = max(start-w, 0)
	if n >= w {
		return lo, off + n
	}
	hi = (off + n) &^ (w - 1)
	if hi <= start {
		return 0, 0
	}
	return lo, hi
}
