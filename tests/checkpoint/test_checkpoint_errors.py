"""Bad input gets an error naming the values: another model, a missing shard, a corrupted file, a
changed global batch, a directory with nothing committed, a step already there, a file that
would run code. One process, no process group."""
import json
import os
import pickle

import pytest
import torch

from pipelib.checkpoint.errors import (CorruptCheckpointError, IncompatibleCheckpointError, MissingShardError,
                                       NoCheckpointError)
from pipelib.checkpoint.files import CHECKSUMS
from pipelib.checkpoint.manifest import MANIFEST, rank_file, step_dir
from pipelib.checkpoint.pieces import Piece, Split
from pipelib.checkpoint.sharded import load_sharded, load_whole, save_sharded
from pipelib.checkpoint.training import fixed_settings
from pipelib.model import GPTConfig
from pipelib.recipe import Recipe

SMALL = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32)


def _model_state(config):
    model = Recipe(config).build()
    return {f"model/{n}": (p.detach(), Piece(tuple(p.shape))) for n, p in model.named_parameters()}


def _wanted(state):
    return {k: piece for k, (_, piece) in state.items()}


def _saved(tmp_path, config=SMALL, recipe=None):
    root = str(tmp_path / "ck")
    state = _model_state(config)
    save_sharded(root, 3, state, fixed=fixed_settings(recipe or Recipe(config)))
    return root, state


def test_a_directory_with_no_committed_checkpoint(tmp_path):
    with pytest.raises(NoCheckpointError, match="no step-NNNNNNNN directory"):
        load_whole(str(tmp_path))
    os.makedirs(step_dir(str(tmp_path), 7))  # a save cut before its manifest
    with pytest.raises(NoCheckpointError, match=r"step directories \[7\] have no manifest.json"):
        load_whole(str(tmp_path))


def test_a_checkpoint_of_another_model_names_the_tensors_and_shapes(tmp_path):
    root, _ = _saved(tmp_path)
    other = _model_state(GPTConfig(n_layer=1, n_head=2, n_embd=24, block_size=8, vocab_size=32))
    with pytest.raises(IncompatibleCheckpointError, match=r"shapes differ: model/embed.wte.weight: saved "
                                                          r"\(32, 16\), now \(32, 24\);.*c_attn.weight: saved "
                                                          r"\(48, 16\), now \(72, 24\)"):
        load_sharded(root, _wanted(other))
    deeper = _model_state(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=32))
    with pytest.raises(IncompatibleCheckpointError, match=r"missing \['model/blocks.1.attn.c_attn.bias'"):
        load_sharded(root, _wanted(deeper), expected=set(deeper))


def test_a_changed_global_batch_or_data_order_is_refused_naming_both_values(tmp_path):
    root, state = _saved(tmp_path, recipe=Recipe(SMALL, batch_size=8))
    with pytest.raises(IncompatibleCheckpointError, match="global_batch: saved 8, now 16"):
        load_sharded(root, _wanted(state), fixed=fixed_settings(Recipe(SMALL, batch_size=16)))
    with pytest.raises(IncompatibleCheckpointError, match="data_seed: saved 0, now 1"):
        load_sharded(root, _wanted(state), fixed=fixed_settings(Recipe(SMALL, batch_size=8, data_seed=1)))
    # what may change: the steps, the learning rate
    load_sharded(root, _wanted(state), fixed=fixed_settings(Recipe(SMALL, batch_size=8, steps=9, lr=0.5)))


def test_a_missing_shard_names_the_file(tmp_path):
    root, state = _saved(tmp_path)
    os.remove(os.path.join(step_dir(root, 3), rank_file(0)))
    with pytest.raises(MissingShardError,
                       match=r"lists rank-00000.pt \(rank 0's shard, \d+ bytes\), but it is missing"):
        load_sharded(root, _wanted(state))


def test_a_corrupted_file_fails_its_checksum(tmp_path):
    root, state = _saved(tmp_path)
    path = os.path.join(step_dir(root, 3), rank_file(0))
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x01  # one bit
    open(path, "wb").write(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=r"rank-00000.pt \(rank 0\) has \d+ bytes with crc32 "
                                                     r"[0-9a-f]{8}, the manifest says \d+ bytes with [0-9a-f]{8}"):
        load_sharded(root, _wanted(state))


def test_pieces_that_do_not_cover_a_tensor_are_refused(tmp_path):
    root = str(tmp_path)
    half = Piece((4, 2), Split(dim=0, fused=1, index=0, count=2))  # the other rank's half never saved
    save_sharded(root, 1, {"model/w": (torch.ones(2, 2), half)})
    with pytest.raises(IncompatibleCheckpointError,
                       match=r"model/w \(shape \(4, 2\)\) leave 4 of 8 elements uncovered"):
        load_sharded(root, {"model/w": Piece((4, 2))})


def test_a_committed_step_is_never_overwritten(tmp_path):
    root, state = _saved(tmp_path)
    with pytest.raises(FileExistsError, match="step 3 is already committed"):
        save_sharded(root, 3, state)


def test_loading_runs_no_code_from_a_file(tmp_path):
    """A file whose checksum matches but which pickles an object (code on load): weights_only refuses."""
    root, state = _saved(tmp_path)
    directory = step_dir(root, 3)
    path = os.path.join(directory, rank_file(0))
    torch.save({"tensors": {}, "extra": {"payload": _Payload()}}, path)
    manifest = json.load(open(os.path.join(directory, MANIFEST)))
    digest = CHECKSUMS[manifest["files"][0]["algorithm"]]()
    digest.update(open(path, "rb").read())
    manifest["files"][0].update(checksum=digest.hexdigest(), nbytes=os.path.getsize(path))
    json.dump(manifest, open(os.path.join(directory, MANIFEST), "w"))
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        load_sharded(root, _wanted(state))


class _Payload:
    """Any class: loading it would run its module's code."""
