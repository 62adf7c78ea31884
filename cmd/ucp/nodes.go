package main

import (
	"fmt"
	"os"
	"strconv"
)

// launcherEnv lists the (rank, size) variables of cluster launchers, in
// the order they are tried: Open MPI, MPICH's PMI, torchrun / generic,
// Slurm, and Kubernetes Indexed Jobs (whose size is not in the environment:
// set UCP_NUM_NODES in the Job spec or pass --num-nodes). Launchers that
// start the processes themselves come before Slurm: mpirun or torchrun run
// inside a Slurm job leave the job step's SLURM_PROCID/SLURM_NTASKS (0 of
// 1) in every process they start.
var launcherEnv = [][2]string{
	{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
	{"PMI_RANK", "PMI_SIZE"},
	{"RANK", "WORLD_SIZE"},
	{"SLURM_PROCID", "SLURM_NTASKS"},
	{"JOB_COMPLETION_INDEX", "UCP_NUM_NODES"},
}

// nodePlace returns this process's node rank and the node count: the
// flags when given (>= 0 / > 0), else the first launcher whose variables
// are set, else a single node.
func nodePlace(rankFlag, countFlag int, getenv func(string) string) (rank, count int, from string, err error) {
	rank, count, from = rankFlag, countFlag, "flags"
	if rank < 0 || count <= 0 {
		for _, kv := range launcherEnv {
			r, c := getenv(kv[0]), getenv(kv[1])
			if r == "" {
				continue
			}
			ri, err1 := strconv.Atoi(r)
			ci, err2 := strconv.Atoi(c)
			if c == "" && count > 0 {
				ci, err2 = count, nil
			}
			if err1 != nil || err2 != nil {
				return 0, 0, "", fmt.Errorf("%s=%q / %s=%q: not a node rank and count (use --node-rank and --num-nodes)", kv[0], r, kv[1], c)
			}
			if rank < 0 {
				rank = ri
			}
			if count <= 0 {
				count = ci
			}
			from = kv[0] + "/" + kv[1]
			break
		}
	}
	if count <= 0 {
		count = 1
	}
	if rank < 0 {
		rank = 0
	}
	if rank >= count {
		return 0, 0, "", fmt.Errorf("node rank %d is not below the node count %d (from %s)", rank, count, from)
	}
	return rank, count, from, nil
}

// defaultMemory is a quarter of the machine's memory.
func defaultMemory() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err == nil {
		var kb int64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %d kB", &kb); err == nil && kb > 0 {
			return kb * 1024 / 4
		}
	}
	return 4 << 30
}

// parseBytes reads sizes such as 512MiB, 4G, 1073741824.
func parseBytes(s string) (int64, error) {
	mult := int64(1)
	num := s
	units := []struct {
		suffix string
		m      int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
		{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1}}
	for _, u := range units {
		if len(s) > len(u.suffix) && s[len(s)-len(u.suffix):] == u.suffix {
			mult, num = u.m, s[:len(s)-len(u.suffix)]
			break
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("%q is not a size (like 512MiB or 4GiB)", s)
	}
	return int64(f * float64(mult)), nil
}
