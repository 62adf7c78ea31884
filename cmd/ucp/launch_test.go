package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ucp-project/ucp/internal/atomic"
	"github.com/ucp-project/ucp/internal/testkit"
)

// launchFixture is converted by every launcher test: 3 nodes share its
// parameters unevenly.
var launchFixture = []string{"deepspeed", "megatron_tp2_pp2_bf16opt_dp2", "checkpoint"}

// nodeScript runs one node under a launcher: it takes the node rank from
// the launcher's variable named in $UCP_RANK_VAR only to decide whether
// this is the node to kill; ucp itself reads the launcher's environment.
// The killed node stops after the phase $UCP_KILL_PHASE (default: its
// reducers finished, "converted") and is killed with SIGKILL; the script
// then exits 0 so that the launcher does not tear the other nodes down
// with it.
const nodeScript = `#!/bin/sh
eval rank=\${$UCP_RANK_VAR}
phase=${UCP_KILL_PHASE:-converted}
if [ -n "$UCP_KILL_RANK" ] && [ "$rank" = "$UCP_KILL_RANK" ]; then
  err=$(mktemp)
  UCP_STOP_AFTER=$phase "$@" 2>"$err" & pid=$!
  i=0
  until grep -q "stopped after $phase" "$err"; do
    i=$((i+1)); [ $i -gt 3000 ] && { cat "$err" >&2; kill -9 $pid; exit 1; }
    sleep 0.1
  done
  kill -9 $pid; wait $pid; rm -f "$err"
  echo "node $rank killed after $phase"
  exit 0
fi
exec "$@"
`

// launcher is one way to start 3 ucp processes: args returns the command
// line that starts cmd... on 3 nodes; rankVar and sizeVar are where the
// launcher puts a node's rank and the node count.
type launcher struct {
	name, rankVar, sizeVar string
	args                   func(t *testing.T, cmd []string) []string
	env                    []string
}

// runLaunched converts src into dst on 3 nodes started by l, with the
// node of rank kill (>= 0) killed after its share was converted.
func runLaunched(t *testing.T, l launcher, src, dst string, kill int) string {
	t.Helper()
	return runLaunchedArgs(t, l, []string{"convert", "--workers", "1", "--chunk-elems", "11", src, dst}, kill)
}

// runLaunchedArgs runs ucp args on 3 nodes started by l, with the node of
// rank kill (>= 0) killed after the phase $UCP_KILL_PHASE.
func runLaunchedArgs(t *testing.T, l launcher, args []string, kill int) string {
	t.Helper()
	script := filepath.Join(t.TempDir(), "node.sh")
	if err := os.WriteFile(script, []byte(nodeScript), 0o755); err != nil {
		t.Fatal(err)
	}
	argv := l.args(t, append([]string{script, os.Args[0]}, args...))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "UCP_TEST_AS_MAIN=1", "UCP_RANK_VAR="+l.rankVar)
	cmd.Env = append(cmd.Env, l.env...)
	if kill >= 0 {
		cmd.Env = append(cmd.Env, fmt.Sprintf("UCP_KILL_RANK=%d", kill))
	}
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%s still running after 5 minutes: %s", l.name, out)
	}
	if err != nil {
		t.Fatalf("%v: %v\n%s", argv, err, out)
	}
	return string(out)
}

// convertOneNode converts src in one process into tmp/ref/atomic, the
// reference of the multi-node runs.
func convertOneNode(t *testing.T, src, tmp string) string {
	t.Helper()
	ref := filepath.Join(tmp, "ref", "atomic")
	if r := ucp(t, nil, "convert", "--quiet", src, ref); r.code != 0 {
		t.Fatalf("single node: %s", r.stderr)
	}
	return ref
}

// sameCheckpoint fails unless dst has the files of ref, byte for byte, and
// a manifest listing the same parameters and checksums, block CRC-32s of
// every state file included.
func sameCheckpoint(t *testing.T, ref, dst, what string) {
	t.Helper()
	a, b := testkit.ReadTree(t, ref), testkit.ReadTree(t, dst)
	if len(a) != len(b) {
		t.Fatalf("%s: %d files vs %d in the 1-node run", what, len(b), len(a))
	}
	for k, v := range a {
		if !bytes.Equal(v, b[k]) {
			t.Errorf("%s: %s differs from the 1-node run", what, k)
		}
	}
	m1, err1 := atomic.ReadManifest(ref)
	m2, err2 := atomic.ReadManifest(dst)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	j1, _ := json.Marshal(m1.Params)
	j2, _ := json.Marshal(m2.Params)
	if !bytes.Equal(j1, j2) {
		t.Errorf("%s: the manifest lists different parameters or checksums", what)
	}
	// Every tensor's state file has block CRC-32s, those filled by several
	// nodes too (combined by the finalizer from the nodes' records), and
	// the comparison above found them equal to the 1-node run's. A step
	// file holds no tensor data.
	for _, p := range m2.Params {
		for _, f := range p.Files {
			if f.Blocks == "" && f.State != atomic.StepState {
				t.Errorf("%s: %s has no block CRC-32s", what, f.Path)
			}
		}
	}
}

// testLauncher: 3 nodes under l give the 1-node output byte for byte;
// with node 2 killed, the others finish their shares and a rerun of
// node 2 alone (its rank from the same variables) completes the job.
func testLauncher(t *testing.T, l launcher) {
	src := testkit.Fixture(launchFixture...)
	tmp := t.TempDir()
	ref := convertOneNode(t, src, tmp)
	dst := filepath.Join(tmp, "all", "atomic")
	out := runLaunched(t, l, src, dst, -1)
	if strings.Count(out, " of 3 (from "+l.rankVar) != 3 {
		t.Errorf("%s: want 3 nodes that took their rank from %s:\n%s", l.name, l.rankVar, out)
	}
	sameCheckpoint(t, ref, dst, l.name)

	dst = filepath.Join(tmp, "killed", "atomic")
	out = runLaunched(t, l, src, dst, 2)
	if !strings.Contains(out, "node 2 killed after converted") {
		t.Fatalf("%s: node 2 was not killed:\n%s", l.name, out)
	}
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Fatalf("%s: %s appeared with node 2 killed:\n%s", l.name, dst, out)
	}
	r := ucp(t, []string{l.rankVar + "=2", l.sizeVar + "=3"}, "convert", "--workers", "1", "--chunk-elems", "11", src, dst)
	if r.code != 0 || !strings.Contains(r.stdout, "finalized") {
		t.Fatalf("%s: rerun of node 2: %d %s %s", l.name, r.code, r.stdout, r.stderr)
	}
	sameCheckpoint(t, ref, dst, l.name+", node 2 killed and rerun")
}

// TestMpirun runs the 3 nodes under Open MPI's mpirun (openmpi-bin).
func TestMpirun(t *testing.T) {
	testLauncher(t, mpirunLauncher)
}

// TestMpirunReshard: reshard --to megatron --ckpt-format torch_dist on 3
// nodes under mpirun equals the 1-node reshard; with node 2 killed after
// writing its rank files, the folder does not appear until node 2 is
// rerun alone (its rank from Open MPI's variables).
func TestMpirunReshard(t *testing.T) {
	l := mpirunLauncher
	l.env = append(l.env, "UCP_KILL_PHASE=node-wrote")
	dir := t.TempDir()
	src := atomicOf(t, dir, [2]string{"megatron", "pp2_vpp2_distopt"})
	flags := []string{"--to", "megatron", "--ckpt-format", "torch_dist", "--tp", "2", "--pp", "2"}
	oneRoot := filepath.Join(dir, "one")
	if r := ucp(t, nil, append([]string{"reshard", "--quiet", src, filepath.Join(oneRoot, "save")}, flags...)...); r.code != 0 {
		t.Fatalf("single node: %s", r.stderr)
	}
	for _, kill := range []int{-1, 2} {
		root := filepath.Join(dir, fmt.Sprintf("k%02d", kill+10)) // as long as oneRoot: .metadata names the folder
		save := filepath.Join(root, "save")
		out := runLaunchedArgs(t, l, append([]string{"reshard", src, save}, flags...), kill)
		if strings.Count(out, " of 3 (from OMPI_COMM_WORLD_RANK") != 3-min(kill+1, 1) {
			t.Errorf("want the nodes to take their rank from Open MPI's variables:\n%s", out)
		}
		if kill >= 0 {
			if _, err := os.Stat(filepath.Join(save, "iter_0000010")); !os.IsNotExist(err) {
				t.Fatalf("the folder appeared with node 2 killed:\n%s", out)
			}
			r := ucp(t, []string{"OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=3"}, append([]string{"reshard", src, save}, flags...)...)
			if r.code != 0 || !strings.Contains(r.stdout, "finalized") {
				t.Fatalf("rerun of node 2: %d %s %s", r.code, r.stdout, r.stderr)
			}
		}
		sameSave(t, filepath.Join(oneRoot, "save"), save, oneRoot, root, fmt.Sprintf("mpirun, node %d killed", kill))
	}
}

var mpirunLauncher = launcher{name: "mpirun", rankVar: "OMPI_COMM_WORLD_RANK", sizeVar: "OMPI_COMM_WORLD_SIZE",
	args: func(t *testing.T, cmd []string) []string {
		mpirun := testkit.Tool(t, "mpirun", "the Open MPI launcher test")
		// --oversubscribe: 3 processes on a machine of fewer cores;
		// root is allowed in CI containers.
		return append([]string{mpirun, "-n", "3", "--oversubscribe", "--allow-run-as-root"}, cmd...)
	},
	// No network transport is needed: ucp does not call MPI.
	env: []string{"OMPI_MCA_btl=self", "OMPI_MCA_plm=isolated", "OMPI_MCA_rmaps_base_oversubscribe=1"}}

// TestTorchrun runs the 3 nodes under torchrun (torch.distributed.run of
// Debian's torch 1.13, whose flags are spelled with underscores; torch 2
// takes --nproc-per-node and --no-python too). "--redirects 2 --tee 2":
// 1.13's default "0" cannot be parsed under Python 3.11 (its Std.from_str
// finds no IntFlag member 0 and torchrun fails in to_map), so stderr is
// teed with a prefix while stdout passes through.
func TestTorchrun(t *testing.T) {
	testLauncher(t, launcher{name: "torchrun", rankVar: "RANK", sizeVar: "WORLD_SIZE",
		args: func(t *testing.T, cmd []string) []string {
			torchrun := testkit.Tool(t, "torchrun", "the torchrun launcher test")
			return append([]string{torchrun, "--standalone", "--nproc_per_node", "3", "--no_python",
				"--redirects", "2", "--tee", "2"}, cmd...)
		},
		env: []string{"OMP_NUM_THREADS=1"}})
}

// TestSrun runs the 3 nodes as the tasks of srun -n 3 on a one-host Slurm
// cluster (slurm-wlm and munge) that it starts on loopback with its own
// configuration, key and ports, and stops again. The daemons run as root.
func TestSrun(t *testing.T) {
	conf := startSlurm(t)
	testLauncher(t, launcher{name: "srun", rankVar: "SLURM_PROCID", sizeVar: "SLURM_NTASKS",
		args: func(t *testing.T, cmd []string) []string {
			return append([]string{testkit.Tool(t, "srun", "the Slurm launcher test"), "-n", "3", "--overcommit"}, cmd...)
		},
		env: []string{"SLURM_CONF=" + conf}})
}

// slurmConf is a one-node cluster on 127.0.0.1: no cgroups, no accounting.
const slurmConf = `ClusterName=ucptest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={{ctldPort}}
SlurmdPort={{slurmdPort}}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={{dir}}/munge.sock
CredType=cred/munge
StateSaveLocation={{dir}}/state
SlurmdSpoolDir={{dir}}/spool
SlurmctldPidFile={{dir}}/slurmctld.pid
SlurmdPidFile={{dir}}/slurmd.pid
SlurmctldLogFile={{dir}}/slurmctld.log
SlurmdLogFile={{dir}}/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=localhost NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
`

// startSlurm starts munged, slurmctld and slurmd for this test and
// returns the path of their slurm.conf; they are stopped at cleanup.
func startSlurm(t *testing.T) string {
	tools := map[string]string{}
	for _, name := range []string{"munged", "mungekey", "slurmctld", "slurmd", "srun", "sinfo"} {
		tools[name] = testkit.Tool(t, name, "the Slurm launcher test")
	}
	if os.Geteuid() != 0 {
		t.Skip("the Slurm daemons of this test run as root")
	}
	// A short path: the munge socket's name must fit a sockaddr_un.
	dir, err := os.MkdirTemp("", "ucp-slurm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, sub := range []string{"state", "spool"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	conf := strings.NewReplacer("{{dir}}", dir, "{{ctldPort}}", freePort(t), "{{slurmdPort}}", freePort(t)).Replace(slurmConf)
	confPath := filepath.Join(dir, "slurm.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(tools["mungekey"], "-c", "-k", filepath.Join(dir, "munge.key")).CombinedOutput(); err != nil {
		t.Fatalf("mungekey: %v %s", err, out)
	}
	daemon(t, dir, tools["munged"], "-F", "-f", "--socket="+dir+"/munge.sock", "--key-file="+dir+"/munge.key",
		"--log-file="+dir+"/munged.log", "--pid-file="+dir+"/munged.pid", "--seed-file="+dir+"/munged.seed")
	daemon(t, dir, tools["slurmctld"], "-D", "-i", "-f", confPath)
	daemon(t, dir, tools["slurmd"], "-D", "-f", confPath, "-N", "localhost")
	for start := time.Now(); ; time.Sleep(500 * time.Millisecond) {
		cmd := exec.Command(tools["sinfo"], "-h", "-o", "%T")
		cmd.Env = append(os.Environ(), "SLURM_CONF="+confPath)
		out, _ := cmd.Output()
		if strings.TrimSpace(string(out)) == "idle" {
			break
		}
		if time.Since(start) > time.Minute {
			logs, _ := exec.Command("sh", "-c", "tail -n 20 "+dir+"/*.log "+dir+"/*.out").CombinedOutput()
			t.Fatalf("the Slurm node is not idle after a minute (sinfo: %q):\n%s", out, logs)
		}
	}
	return confPath
}

// daemon starts a foreground daemon with its output in dir, and stops it
// (SIGTERM, then SIGKILL) when the test ends.
func daemon(t *testing.T, dir, path string, args ...string) {
	t.Helper()
	out, err := os.Create(filepath.Join(dir, filepath.Base(path)+".out"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); out.Close(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}
