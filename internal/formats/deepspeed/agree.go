package deepspeed

import (
	"fmt"

	"github.com/ucp-project/ucp/internal/pyobj"
)

// checkRanks refuses rank files of different runs: every model-state and
// optimizer file must agree on the DeepSpeed config and version, and the
// optimizer files on the optimizer wrapper, ZeRO stage, loss scaler,
// optimizer class and hyper-parameters, partition counts, the dtype of
// the flat groups and the step of each param group.
func checkRanks(dir string, models []*modelState, optims map[[2]int]*optimState, D, M int) error {
	r := &Ranks{Dir: dir}
	for mp, m := range models {
		rank := fmt.Sprintf("model-parallel rank %d", mp)
		if err := sharedModelFields(r, m.path, pyobj.NewDec(m.path, m.root), rank); err != nil {
			return err
		}
	}
	for dp := 0; dp < D; dp++ {
		for mp := 0; mp < M; mp++ {
			if err := OptimizerFields(r, optims[[2]int{dp, mp}].path, fmt.Sprintf("rank dp %d mp %d", dp, mp),
				optims[[2]int{dp, mp}].root); err != nil {
				return err
			}
		}
	}
	return nil
}

// sharedModelFields records what the model-state file of one rank shares
// with the other ranks of its run.
func sharedModelFields(r *Ranks, path string, model pyobj.Dec, rank string) error {
	for _, k := range []string{"ds_config", "ds_version", "dp_world_size", "mp_world_size", "global_steps"} {
		if err := r.Field(path, rank, k, raw(model, k)); err != nil {
			return err
		}
	}
	return model.Err()
}

// raw returns d[k] as it is, nil when absent or None: Ranks compares
// values of any type (absent everywhere agrees).
func raw(d pyobj.Dec, k string) pyobj.Value {
	if c, ok := d.Opt(k); ok {
		return c.Value()
	}
	return nil
}
