package deepspeed

import "fmt"

// checkRanksZero3 refuses rank files of different runs: all files agree on the
// DeepSpeed config and version and what the optimizer files share
// (OptimizerFields), and the ranks of one tensor-parallel
// column on the names and shapes of the parameters.
func checkRanksZero3(dir string, grid [][]*rank) error {
	r := &Ranks{Dir: dir}
	for tp, col := range grid {
		for dp, rk := range col {
			label := fmt.Sprintf("rank dp %d mp %d", dp, tp)
			if err := sharedModelFields(r, rk.mpath, rk.model, label); err != nil {
				return err
			}
			shapes := raw(rk.model, "param_shapes")
			if err := r.Field(rk.mpath, label, fmt.Sprintf("param_shapes (names and shapes of model-parallel rank %d)", tp), shapes); err != nil {
				return err
			}
			if err := OptimizerFields(r, rk.opath, label, rk.oroot); err != nil {
				return err
			}
		}
	}
	return nil
}
