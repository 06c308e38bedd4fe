"""DeepSpeed's pipeline engine beside pipelib's executor (chapter 19, issue 25 item 6).

`PipelineModule` and `PipelineEngine.train_batch` on two spawned CPU processes, no launcher,
chapter 12's MLP and batch: the gradients of its 1F1B step equal the single process's and
pipelib's 1F1B executor's, run on the same ranks; the configurations set side by side.
"""
import pytest

pytest.importorskip("deepspeed")


def test_deepspeed_pipeline_equals_pipelib_and_one_process():
    from pipelib.model import MLPConfig
    from pipelib.pipeline.deepspeed_pipe import compare_with_pipelib

    cfg = MLPConfig(num_layers=6, hidden=32)
    c = compare_with_pipelib(cfg, num_microbatches=4, batch=8)  # raises, naming the tensor, if any differs
    assert len(c.deepspeed.grads) == len(c.pipelib.grads) == 2 * cfg.num_layers  # weight and bias per layer
    assert c.deepspeed.max_abs_diff < 1e-5 and c.max_abs_diff < 1e-5
    assert float(c.deepspeed.loss) == pytest.approx(float(c.pipelib.loss), rel=1e-6)
    assert c.deepspeed_parts == c.pipelib_parts == (0, 3, 6)  # both cut 6 layers 3 and 3
    assert c.config["gradient_accumulation_steps"] == 4 and c.config["train_micro_batch_size_per_gpu"] == 2


def test_configs_beside_name_the_same_numbers():
    from pipelib.pipeline.deepspeed_pipe import configs_beside, pipe_config

    rows = {concept: (ours, theirs) for concept, ours, theirs in configs_beside(num_microbatches=8, batch=32)}
    assert "microbatches=8" in rows["microbatches"][0] and '"gradient_accumulation_steps": 8' in rows["microbatches"][1]
    assert rows["rows per microbatch"][1].endswith(": 4")
    assert pipe_config(8, 4)["train_batch_size"] == 32


def test_bad_input_names_the_values():
    from pipelib.pipeline.deepspeed_pipe import run_deepspeed_pipe

    with pytest.raises(ValueError, match="batch=10 does not split into num_microbatches=4"):
        run_deepspeed_pipe(num_microbatches=4, batch=10)
    with pytest.raises(ValueError, match="4 layers cannot fill 8 stages"):
        run_deepspeed_pipe(world_size=8)
