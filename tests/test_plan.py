"""`Plan` with its sections: prints, round-trips through JSON, reads the earlier flat layout,
takes the CLI's flat flags, and names every value that does not fit before any engine starts."""
import json

import pytest
import torch

from pipelib.model import GPTConfig
from pipelib.plan import ContextOptions, DataOptions, PipelineOptions, Plan, TensorOptions
from pipelib.recipe import Recipe

GPT = GPTConfig(vocab_size=64, block_size=8, n_layer=4, n_head=2, n_embd=16)


def test_sections_print_and_round_trip_through_json():
    plan = Plan(dp=2, tp=2, pp=2, data=DataOptions("zero1", bucket_bytes=1 << 20),
                tensor=TensorOptions(sequence_parallel=True),
                pipeline=PipelineOptions("interleaved_1f1b", microbatches=4, virtual=2), recompute="full")
    assert str(plan) == "Plan(dp=2 x tp=2 x pp=2: zero1; interleaved_1f1b, m=4, v=2; sequence parallel; recompute full)"
    back = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert back == plan and back.pipeline.schedule_for(2).num_stages == 4
    assert Plan(pp=2, pipeline=PipelineOptions(layers=[1, 3])).to_dict()["pipeline"]["layers"] == [1, 3]


def test_a_section_by_its_most_common_value_and_the_flat_layout():
    assert Plan(dp=2, data="zero3").data == DataOptions("zero3")
    assert Plan(pp=2, pipeline="gpipe").pipeline == PipelineOptions("gpipe")
    assert Plan(cp=2, context="contiguous").context == ContextOptions("contiguous")
    flat = {"dp": 2, "pp": 2, "data_parallel": "zero1", "schedule": "gpipe", "microbatches": 4,
            "sequence_parallel": False, "bucket_bytes": 1024}
    want = Plan(dp=2, pp=2, data=DataOptions("zero1", 1024), pipeline=PipelineOptions("gpipe", 4))
    assert Plan.from_dict(flat) == want
    assert Plan(dp=2).replace(microbatches=8, pp=2, data_parallel="zero1") == Plan(
        dp=2, pp=2, data="zero1", pipeline=PipelineOptions(microbatches=8))


@pytest.mark.parametrize("make, match", [
    (lambda: Plan(dp=2, data="zero9"), r"data kind 'zero9'; use one of \['ddp'"),
    (lambda: Plan(pp=2, pipeline="2f2b"), r"2f2b"),
    (lambda: PipelineOptions("gpipe", virtual=2), r"virtual=2 with schedule='gpipe', which runs one stage per rank"),
    (lambda: PipelineOptions(microbatches=0), r"microbatches"),
    (lambda: PipelineOptions(layers=(2, 0)), r"layers=\(2, 0\); give one block count >= 1 per stage"),
    (lambda: Plan(pp=2, pipeline=PipelineOptions(layers=(1, 1, 2))), r"gives 3 stages, but pp=2 with '1f1b' cuts 2"),
    (lambda: Plan(dp=2, pp=2, data="zero2"), r"data kind 'zero2' with pp=2"),
    (lambda: Plan(dp=2, data=7), r"data=7; pass a DataOptions or its kind as a string"),
    (lambda: Plan(recompute="sometimes"), r"sometimes"),
    (lambda: Plan.from_dict({"dp": 2, "zero": 1}), r"unknown keys \['zero'\]"),
    (lambda: Plan.from_dict({"pipeline": {"schedule": "1f1b", "chunks": 2}}),
     r"unknown keys \['chunks'\] in 'pipeline'"),
    (lambda: Plan(cp=2, context="spiral"), r"spiral"),
])
def test_bad_values_are_named(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_check_against_the_recipe_names_the_values():
    recipe = Recipe(GPT, batch_size=8, dtype=torch.float32)
    Plan(pp=2, pipeline=PipelineOptions(layers=(1, 3))).check(recipe)
    with pytest.raises(ValueError, match=r"layers=\(1, 2\) sum to 3 blocks but the GPT has n_layer=4"):
        Plan(pp=2, pipeline=PipelineOptions(layers=(1, 2))).check(recipe)
    with pytest.raises(ValueError, match=r"batch_size=8 does not split into dp=2 ranks x 3 microbatches"):
        Plan(dp=2, pp=2, pipeline=PipelineOptions(microbatches=3)).check(recipe)
    with pytest.raises(ValueError, match=r"needs 8 ranks but the cluster has 4"):
        Plan(dp=2, tp=2, pp=2).check(recipe, world_size=4)
