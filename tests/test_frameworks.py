"""detload where frameworks expect torch's pieces: a DataLoader around it, PyTorch Lightning, Accelerate.

Checks: both loaders are IterableDatasets (Loader without ``import detload``
importing torch, whatever the import order); ``DataLoader(loader,
batch_size=None)`` yields the loader's own batches; DataLoader worker
processes are refused with a message that says what to do; the
docs/distributed.md examples run as written; Lightning and Accelerate runs
resumed from checkpoints write the manifest of an uninterrupted run; and
``detload.torch`` without torch names the extra to install. Lightning and
Accelerate run in subprocesses, as a training script would.
"""

from __future__ import annotations

import copy
import gc
import os
import pickle
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import _distdata
import pytest
from leaks import stray_children, wait_until

from detload import Loader, OptionError, hash_batch

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "distributed.md"
OPTS = dict(batch_size=200, seed=3, columns=["id", "s", "x"])


@pytest.fixture(scope="module")
def ds(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("frameworks") / "ds")
    _distdata.write(root)
    return root


def python(code: str, *args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``code`` as a script (``__main__``), with this checkout's detload importable."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    if cwd is not None:
        env["TMPDIR"] = str(cwd)  # the examples' temporary folders go where the test cleans up
        script = cwd / "script.py"
        script.write_text(code)
        cmd = [sys.executable, str(script), *args]
    else:
        cmd = [sys.executable, "-c", code, *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def ok(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 0, f"exit {res.returncode}\n--- stdout\n{res.stdout}\n--- stderr\n{res.stderr[-6000:]}"
    return res.stdout


def reference(ds: str, epoch: int = 0, **kw) -> list[str]:
    with Loader(ds, **{**OPTS, **kw}) as loader:
        loader.set_epoch(epoch)
        return [hash_batch(b)[0] for b in loader]


# -- torch.utils.data.DataLoader -------------------------------------------------

REGISTRATION = """
import inspect, sys
order, ds = sys.argv[1], sys.argv[2]
if order == "torch first":
    import torch.utils.data
import detload
assert order == "torch first" or "torch" not in sys.modules, "import detload imported torch"
loader = detload.Loader(ds, batch_size=500, seed=1, columns=["id"])
assert order == "torch first" or "torch" not in sys.modules, "Loader() imported torch"
from torch.utils.data import DataLoader, IterableDataset
assert isinstance(loader, IterableDataset)
assert sum(len(b["id"]) for b in DataLoader(loader, batch_size=None)) == loader.dataset.rows
assert not [f for f in sys.meta_path if type(f).__module__.startswith("detload")], "the finder stayed"
inspect.getsource(DataLoader)
assert not type(sys.modules["torch.utils.data"].__loader__).__module__.startswith("detload"), "our loader stayed"
from detload.torch import TorchLoader
assert isinstance(TorchLoader(loader), IterableDataset)
print("ok")
"""


@pytest.mark.parametrize("order", ["detload first", "torch first"])
def test_both_loaders_are_iterable_datasets_whatever_the_import_order(ds, order):
    assert ok(python(REGISTRATION, order, ds)).strip() == "ok"


def test_a_dataloader_yields_the_loaders_batches(ds):
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from detload.torch import TorchLoader

    want = reference(ds, columns=["id", "x"])
    with Loader(ds, **{**OPTS, "columns": ["id", "x"]}) as loader:
        dl = DataLoader(loader, batch_size=None)
        assert len(dl) == len(want)
        got = [hash_batch({k: v.numpy() for k, v in b.items()})[0] for b in dl]
    assert got == want
    want = reference(ds, epoch=1)
    for device in (None, "cpu"):  # in the loop, and through the feeder thread
        with TorchLoader(Loader(ds, **OPTS), device=device) as tl:
            tl.set_epoch(1)
            got = [hash_batch(_numpy(b))[0] for b in DataLoader(tl, batch_size=None)]
        assert got == want, device


def _numpy(batch) -> dict:
    from detload import Ragged
    from detload.torch import RaggedTensor

    return {k: Ragged(v.values.numpy(), v.offsets.numpy(), v.kind) if isinstance(v, RaggedTensor) else v.numpy()
            for k, v in batch.items()}


def test_default_convert_passes_a_torchloader_batch_through(tmp_path):
    """What DataLoader(batch_size=None) applies to each batch: datetime and ragged columns included."""
    pytest.importorskip("torch")
    from _s3server import write_sample_dataset
    from torch.utils.data import default_convert

    from detload.torch import RaggedTensor, TorchLoader

    root = write_sample_dataset(tmp_path / "ds", {"a.parquet": [100, 60]})
    with TorchLoader(Loader(root, batch_size=64, seed=1)) as tl:
        batch = next(iter(tl))
        out = default_convert(batch)
        assert type(out) is dict and list(out) == list(batch)
        for name, col in batch.items():
            if isinstance(col, RaggedTensor):
                assert type(out[name]) is RaggedTensor and out[name].kind == col.kind
                assert out[name].values is col.values and out[name].offsets is col.offsets
            else:
                assert out[name] is col
        assert {n: type(c).__name__ for n, c in batch.items()} == {
            "id": "Tensor", "x": "Tensor", "label": "Tensor", "emb": "Tensor",
            "s": "RaggedTensor", "hist": "RaggedTensor", "ts": "Tensor"}


WORKERS_REFUSED = (r"^a {what} cannot run in the worker processes of a torch DataLoader \(num_workers=2\): detload "
                   r"is already parallel, and each of them would read the whole epoch\. Pass num_workers=0 to the "
                   r"DataLoader \(with batch_size=None\) and set the {what}'s own workers= \(and pool=\"process\"\)$")
PICKLING_REFUSED = (r"^a {what} cannot be pickled or copied: it holds worker threads or processes and shared memory\. "
                    r"A torch DataLoader with num_workers > 0 pickles its dataset for each worker process, and detload "
                    r"is already parallel: pass num_workers=0 to the DataLoader \(with batch_size=None\) and set the "
                    r"{what}'s own workers= \(and pool=\"process\"\)\. Elsewhere, build the {what} in the process that "
                    r"iterates it$")


@pytest.mark.parametrize("what", ["Loader", "TorchLoader"])
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_worker_processes_are_refused(ds, what, context):
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from detload.torch import TorchLoader

    loader = Loader(ds, **OPTS)
    subject = loader if what == "Loader" else TorchLoader(loader)
    try:
        dl = DataLoader(subject, batch_size=None, num_workers=2, multiprocessing_context=context)
        with pytest.raises(OptionError) as info:
            for _ in dl:
                pass
        if context == "fork":  # raised in the worker; torch re-raises it with the worker's traceback
            last = str(info.value).rstrip().splitlines()[-1]
            assert re.match(WORKERS_REFUSED.format(what=what), last.split(": ", 1)[1]), last
            assert str(info.value).startswith("Caught OptionError in DataLoader worker process ")
        else:  # spawn pickles the dataset in this process, before any worker starts
            assert re.match(PICKLING_REFUSED.format(what=what), str(info.value)), str(info.value)
        del dl, info
        gc.collect()  # the error's traceback held the DataLoader's iterator, whose __del__ ends its workers
        wait_until(lambda: not stray_children(), 30.0)
        # Refused, the loader is intact: with num_workers=0 it still yields the whole epoch.
        assert len(list(DataLoader(subject, batch_size=None))) == len(loader)
    finally:
        subject.close()


def test_pickling_or_copying_a_loader_is_refused(ds):
    with Loader(ds, **OPTS) as loader:
        for attempt in (pickle.dumps, copy.copy, copy.deepcopy):
            with pytest.raises(OptionError, match=PICKLING_REFUSED.format(what="Loader")):
                attempt(loader)


def test_a_torchloader_pass_takes_its_epoch_and_position_at_its_first_batch(ds):
    """Lightning makes the iterator before the hooks that set the epoch run."""
    pytest.importorskip("torch")
    from detload import DetloadError
    from detload.torch import TorchLoader

    for device in (None, "cpu"):
        with TorchLoader(Loader(ds, **OPTS), device=device) as tl:
            it = iter(tl)
            tl.set_epoch(2)
            assert [hash_batch(_numpy(b))[0] for b in it] == reference(ds, epoch=2)
            state = tl.state_dict()
            it = iter(tl)
            tl.load_state_dict(dict(state, epoch=1, step=3))
            assert [hash_batch(_numpy(b))[0] for b in it] == reference(ds, epoch=1)[3:]
            old, new = iter(tl), iter(tl)
            with pytest.raises(DetloadError, match=r"^this TorchLoader iteration was stopped before it began: "
                                                   r"close\(\) or a new iter\(\) was called since it was made"):
                next(old)
            assert sum(1 for _ in new) == len(tl)
            unstarted = iter(tl)
        with pytest.raises(DetloadError, match="stopped before it began: close"):
            next(unstarted)


# -- docs/distributed.md ------------------------------------------------------------

def doc_example(heading: str) -> str:
    """The runnable (not fragment) python example in the section of docs/distributed.md named ``heading``."""
    text = DOC.read_text()
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"(<!-- fragment -->\n)?```python\n(.*?)```", section, re.S)
    runnable = [code for fragment, code in blocks if not fragment]
    assert len(runnable) == 1, f"expected one runnable example under {heading!r}, found {len(runnable)}"
    return runnable[0]


@pytest.mark.parametrize("heading", ["Inside a torch DataLoader", "PyTorch Lightning", "Hugging Face Accelerate"])
def test_the_docs_examples_run_as_written(tmp_path, heading):
    pytest.importorskip({"PyTorch Lightning": "lightning", "Hugging Face Accelerate": "accelerate"}.get(heading, "torch"))
    res = ok(python(doc_example(heading), cwd=tmp_path))
    if heading == "PyTorch Lightning":
        assert res == ""  # nothing printed; the resumed fit's output is on stderr
    assert not stray_children()


# -- Lightning and Accelerate for real (one process, CPU) -------------------------

LIGHTNING = '''
import json, os, sys
import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader
from detload import hash_batch
from detload.torch import TorchLoader
from detload.verify import verify

data, out = sys.argv[1], sys.argv[2]
STEPS = 9  # per epoch: 1,753 rows in batches of 200


class Model(L.LightningModule):
    def __init__(self, manifest, wrap=False):
        super().__init__()
        self.manifest, self.wrap, self.loader, self.trained = manifest, wrap, None, []
        self.net = torch.nn.Linear(1, 1)

    def train_dataloader(self):
        if self.loader is None:
            self.loader = TorchLoader(data, batch_size=200, seed=3, columns=["id", "s", "x"], workers=2,
                                      manifest=self.manifest)
        return DataLoader(self.loader, batch_size=None) if self.wrap else self.loader

    def on_train_start(self):
        self.loader.set_epoch(self.current_epoch)

    def on_train_epoch_start(self):
        self.loader.set_epoch(self.current_epoch)

    def teardown(self, stage):
        self.loader.close()

    def training_step(self, batch, batch_idx):
        self.trained.append(hash_batch({k: batch[k].numpy() for k in ("id", "x")})[0])
        return self.net(batch["x"][:, None]).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(model, ckpt=None, callbacks=()):
    L.Trainer(max_epochs=3, accelerator="cpu", devices=1, use_distributed_sampler=False, logger=False,
              enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=bool(callbacks),
              callbacks=list(callbacks), default_root_dir=out).fit(model, ckpt_path=ckpt)
    return model.trained


ref = os.path.join(out, "ref.jsonl")
every_step = ModelCheckpoint(dirpath=os.path.join(out, "step"), filename="{step}", every_n_train_steps=1,
                             save_top_k=-1, save_on_train_epoch_end=False)
epoch_end = ModelCheckpoint(dirpath=os.path.join(out, "epoch"), filename="{epoch}", save_top_k=-1)
full = fit(Model(ref), callbacks=[every_step, epoch_end])
assert len(full) == 3 * STEPS
results = {}
# mid-epoch; the last batch of an epoch; an epoch's end (the default checkpoint)
for name, done in [("step/step=4", 4), ("step/step=9", 9), ("step/step=13", 13), ("epoch/epoch=0", 9),
                   ("epoch/epoch=1", 18)]:
    resumed = os.path.join(out, name.replace("/", "-") + ".jsonl")
    trained = fit(Model(resumed), ckpt=os.path.join(out, name + ".ckpt"))
    # The interrupted run's manifest (here: all of it), continued by the resumed run's.
    results[name] = [trained == full[done:], verify(ref, [ref, resumed]).message]
wrapped = os.path.join(out, "wrapped.jsonl")
results["DataLoader"] = [fit(Model(wrapped, wrap=True)) == full, verify(ref, wrapped).message]
print(json.dumps(results))
'''


def test_lightning_resumes_every_kind_of_checkpoint_exactly(ds, tmp_path):
    pytest.importorskip("lightning")
    import json

    out = ok(python(LIGHTNING, ds, str(tmp_path), cwd=tmp_path))
    results = json.loads(out.strip().splitlines()[-1])
    for name, (same_batches, message) in results.items():
        assert same_batches and message.startswith("identical"), (name, same_batches, message)


ACCELERATE = '''
import json, os, sys
import torch
from accelerate import Accelerator
from detload.torch import TorchLoader
from detload.verify import verify

data, out = sys.argv[1], sys.argv[2]


def train(manifest, state_dir, stop_after=None):
    accelerator = Accelerator()
    loader = TorchLoader(data, batch_size=200, seed=3, columns=["id", "s", "x"], workers=2, manifest=manifest,
                         distributed=(accelerator.process_index, accelerator.num_processes),
                         device=accelerator.device)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.register_for_checkpointing(loader)
    if os.path.exists(state_dir):
        accelerator.load_state(state_dir)
    steps = 0
    try:
        for epoch in range(loader.epoch, 2):
            loader.set_epoch(epoch)
            for batch in loader:
                accelerator.backward(model(batch["x"][:, None]).mean())
                optimizer.step()
                optimizer.zero_grad()
                steps += 1
                if steps == stop_after:
                    accelerator.save_state(state_dir)
                    return steps
            accelerator.save_state(state_dir)
        return steps
    finally:
        loader.close()


ref = os.path.join(out, "ref.jsonl")
assert train(ref, os.path.join(out, "none")) == 18  # 2 epochs of 9 steps
resumed, state = os.path.join(out, "resumed.jsonl"), os.path.join(out, "state")
# stopped mid-epoch 0, at its last batch, mid-epoch 1, then to the end
steps = [train(resumed, state, stop_after=n) for n in (5, 4, 3)] + [train(resumed, state)]
print(json.dumps([steps, verify(ref, resumed).message]))
'''


def test_accelerate_keeps_detloads_sharding_and_resumes_exactly(ds, tmp_path):
    pytest.importorskip("accelerate")
    import json

    steps, message = json.loads(ok(python(ACCELERATE, ds, str(tmp_path), cwd=tmp_path)).strip().splitlines()[-1])
    assert steps == [5, 4, 3, 6] and message.startswith("identical"), (steps, message)


# -- detload.torch without torch --------------------------------------------------

NO_TORCH = """
import sys
how, ds = sys.argv[1], sys.argv[2]
if how == "None in sys.modules":
    sys.modules["torch"] = None
else:  # not installed: a finder that knows no torch
    class NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, NoTorch())
import detload
with detload.Loader(ds, batch_size=500, seed=1, columns=["id"]) as loader:  # the core needs no torch
    assert sum(len(b["id"]) for b in loader) == loader.dataset.rows
try:
    from detload.torch import TorchLoader
except ImportError as exc:
    print(type(exc).__name__, exc.name, exc.__cause__, exc.__suppress_context__)
    print(exc)
"""


@pytest.mark.parametrize("how", ["None in sys.modules", "not installed"])
def test_detload_torch_without_torch_names_the_extra(ds, how):
    first, message = ok(python(NO_TORCH, how, ds)).strip().splitlines()
    assert first == "ModuleNotFoundError torch None True"
    assert message == (
        'detload.torch needs PyTorch, which is not installed: pip install "detload[torch]". An unpinned torch from '
        "PyPI pulls a multi-GB CUDA build; for the CPU build, install torch first with pip install torch "
        "--index-url https://download.pytorch.org/whl/cpu"
    )


def test_a_broken_torch_is_reported_as_it_is():
    """torch installed but missing one of its own dependencies: not "install detload[torch]"."""
    code = textwrap.dedent("""
        import sys, types
        torch = types.ModuleType("torch")
        torch.__path__ = []
        sys.modules["torch"] = torch
        class Broken:
            def find_spec(self, name, path=None, target=None):
                if name == "torch.utils":
                    raise ModuleNotFoundError("No module named 'sympy'", name="sympy")
        sys.meta_path.insert(0, Broken())
        try:
            import detload.torch
        except ModuleNotFoundError as exc:
            print(exc.name, exc)
    """)
    assert ok(python(code)).strip() == "sympy No module named 'sympy'"
