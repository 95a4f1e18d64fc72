"""The CPU training processes' allocator setting (``softargmax.experiments._allocator``): freed buffers are reused,
so a training step of the lm experiment's model no longer faults in fresh pages."""

import json
import subprocess
import sys

import pytest

STEPS = r"""
import json, resource, sys, torch
from softargmax.experiments._allocator import keep_freed_memory
torch.set_num_threads(1)
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
from softargmax.experiments.pretraining.model import Decoder, DecoderConfig
from softargmax.experiments.pretraining.plan import PRESETS
from softargmax.experiments.pretraining.training import training_loss
torch.manual_seed(0)
P = PRESETS["full"]
model = Decoder(DecoderConfig(vocab=P["vocab"], **P["model"]))
x, y = torch.randint(0, 1024, (16, 64)), torch.randint(0, 1024, (16, 64))
def step():
    model.zero_grad(set_to_none=True)
    training_loss(model, None, "entmax15", x, y, 1024).backward()
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(json.dumps({"kept": kept, "faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5}))
"""


def _faults(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_step_reuses_its_buffers():
    """Each case in a fresh process: the setting is process-wide, so this one (a test worker) is left as it is."""
    plain, kept = _faults("plain"), _faults("keep")
    if kept["kept"] is False:
        pytest.skip("the C library is not glibc: nothing is set")
    if plain["faults"] < 500:
        pytest.skip(f"this allocator already reuses the step's buffers ({plain['faults']:.0f} page faults a step)")
    assert kept["faults"] < plain["faults"] / 5, (plain, kept)
