"""Targets and device gating: which nodes may run in low precision.

A :class:`Target` describes the machine a graph will run on: its devices (GPUs with their
compute capability, the CPU with its instruction-set features) and, for GPUs, the CUDA and
cuDNN versions that gate a few list entries.  It is an explicit input of the rewrite, so a
model can be rewritten for a machine that is not this one (``gpu:8.0``, ``cpu``);
:func:`detect_target` builds one for the local machine and is only called at the API/CLI
boundary.

Placement follows Grappler's virtual placer: a node's device string, or the default device
(the GPU with the smallest id, else the CPU) when it is empty or names no device of the
target.  A node is eligible when its device is of the target's device type (substring match,
so ``XLA_GPU`` counts as GPU) and that device can profit (compute capability >= 7.0 for
float16, >= 8.0 for bfloat16; CPU features for the CPU).
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass, field
from typing import Literal

from ..errors import TargetError

__all__ = [
    "Device",
    "Target",
    "DeviceName",
    "parse_device_name",
    "parse_target",
    "detect_target",
    "cpu_features",
    "GPUS_WITHOUT_TENSOR_CORES",
    "NO_TENSOR_CORES",
    "parse_precision",
    "auto_precision",
    "resolve_precision",
    "PRECISION_SPELLINGS",
]

log = logging.getLogger(__name__)

Precision = Literal["float16", "bfloat16"]

#: Minimum compute capability for fast low-precision math per precision (Tensor Cores).
MIN_GPU_ARCH = {"float16": (7, 0), "bfloat16": (8, 0)}
#: GPUs of compute capability >= 7.0 without Tensor Cores: Turing's TU116 and TU117 chips
#: (GeForce GTX 16xx, MX450/MX550, the T-series workstation and laptop cards), whose float16
#: runs on the CUDA cores at about twice float32's rate, not Tensor Cores' eight.  Matched on
#: the device name TensorFlow reports; such a GPU gets the :data:`NO_TENSOR_CORES` feature.
#: TensorFlow's own pass checks the compute capability only, and converts for them (users
#: measured 2-4x slower steps in float16 on a GTX 1660, tensorflow#44191).
GPUS_WITHOUT_TENSOR_CORES = re.compile(
    r"\bGTX 16\d0\b|\bMX[45]50\b|\b(Quadro )?T(400|500|550|600|1000|1200|2000)\b", re.IGNORECASE)
#: The feature of a GPU that has no Tensor Cores whatever its compute capability.
NO_TENSOR_CORES = "no_tensor_cores"
#: CPU features that give fast low-precision matmul/convolution through oneDNN.
CPU_FEATURES = {
    "float16": ("amx_fp16", "avx512_fp16"),
    "bfloat16": ("amx_bf16", "avx512_bf16"),
}


@dataclass(frozen=True)
class DeviceName:
    """A parsed device string; ``type``/``id`` are ``None`` when absent."""

    job: str | None
    replica: int | None
    task: int | None
    type: str | None
    id: int | None


_DEVICE_PART = re.compile(r"^(?:device:)?([A-Za-z_][A-Za-z0-9_]*):(\d+|\*)$")


@functools.lru_cache(maxsize=4096)
def parse_device_name(text: str) -> DeviceName | None:
    """Parse ``/job:x/replica:0/task:0/device:GPU:0`` and its short forms (``/gpu:0``).

    Returns ``None`` if the string is not a device name.
    """
    if not text:
        return None
    job = replica = task = dtype = did = None
    for part in text.strip("/").split("/"):
        if part.startswith("job:"):
            job = part[4:]
        elif part.startswith("replica:") and part[8:].isdigit():
            replica = int(part[8:])
        elif part.startswith("task:") and part[5:].isdigit():
            task = int(part[5:])
        else:
            m = _DEVICE_PART.match(part)
            if not m:
                return None
            dtype = m.group(1).upper()
            did = None if m.group(2) == "*" else int(m.group(2))
    return DeviceName(job, replica, task, dtype, did)


@dataclass(frozen=True)
class Device:
    """One device of a target.  ``capability`` is a GPU's compute capability."""

    type: str
    id: int = 0
    capability: tuple[int, int] | None = None
    features: frozenset[str] = frozenset()

    @property
    def name(self) -> str:
        return f"/job:localhost/replica:0/task:0/device:{self.type}:{self.id}"


@dataclass(frozen=True)
class Target:
    """The devices a graph will run on.  ``kind`` says which device type is rewritten."""

    kind: Literal["gpu", "cpu"]
    devices: tuple[Device, ...]
    cuda_version: int = 12090
    cudnn_version: int = 91000
    description: str = ""
    assume_features: bool = field(default=False)
    #: TensorFlow's ``TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_IGNORE_PERFORMANCE``: every device
    #: of the target's type counts as able to profit (for testing the numerics of low
    #: precision on hardware that is slow at it, as TensorFlow's own tests do).
    ignore_performance: bool = field(default=False)

    @property
    def device_type(self) -> str:
        return "GPU" if self.kind == "gpu" else "CPU"

    def default_device(self) -> Device:
        """Grappler's virtual placer default: lowest-id GPU, else lowest-id CPU."""
        for t in ("GPU", "CPU"):
            of_type = sorted((d for d in self.devices if d.type == t), key=lambda d: d.id)
            if of_type:
                return of_type[0]
        return self.devices[0]

    def place(self, device: str) -> Device:
        """The target device a node with device string ``device`` runs on."""
        parsed = parse_device_name(device)
        if parsed is not None and parsed.type is not None and parsed.id is not None:
            for d in self.devices:
                if d.type == parsed.type and d.id == parsed.id:
                    return d
        return self.default_device()

    def device_can_profit(self, device: Device, precision: Precision) -> bool:
        """Whether ``device`` has fast kernels for ``precision`` (or the target ignores
        performance)."""
        if self.ignore_performance and device.type in ("GPU", "CPU"):
            return True
        if device.type == "GPU":
            return (device.capability is not None and device.capability >= MIN_GPU_ARCH[precision]
                    and NO_TENSOR_CORES not in device.features)
        if device.type == "CPU":
            return self.assume_features or any(f in device.features for f in CPU_FEATURES[precision])
        return False

    def eligible_devices(self, precision: Precision) -> list[Device]:
        return [
            d for d in self.devices
            if d.type == self.device_type and self.device_can_profit(d, precision)
        ]

    def skip_reason(self, precision: Precision) -> str | None:
        """Why nothing can be rewritten for ``precision`` on this target, or ``None``."""
        if self.eligible_devices(precision):
            return None
        if self.kind == "gpu":
            caps = ", ".join(
                f"GPU:{d.id} compute capability {d.capability[0]}.{d.capability[1]}"
                + (" without Tensor Cores" if NO_TENSOR_CORES in d.features else "")
                for d in self.devices if d.type == "GPU" and d.capability
            ) or "none"
            need = ".".join(map(str, MIN_GPU_ARCH[precision]))
            return (f"no GPU can profit from {precision} (needs Tensor Cores: compute capability >= {need}, "
                    f"and not a GTX 16xx-class chip; found: {caps})")
        need = " or ".join(CPU_FEATURES[precision])
        return f"the CPU has no fast {precision} math (needs {need})"

    def node_is_eligible(self, device: str, precision: Precision) -> bool:
        """Grappler's ``IsOnDevice`` + ``IsOnSuitableGPUArch`` for one node's device string."""
        return _eligible(self, device, precision)

    def _node_is_eligible(self, device: str, precision: Precision) -> bool:
        text = device or self.default_device().name
        parsed = parse_device_name(text)
        if parsed is None or parsed.type is None or parsed.id is None:
            return False
        if self.device_type.lower() not in parsed.type.lower():
            return False
        return self.device_can_profit(self.place(device), precision)


@functools.lru_cache(maxsize=4096)
def _eligible(target: Target, device: str, precision: Precision) -> bool:
    # Graphs repeat a handful of device strings over thousands of nodes.
    return target._node_is_eligible(device, precision)


def _parse_capability(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)(?:\.(\d+))?", text.strip())
    if not m:
        raise TargetError(f"bad compute capability {text!r} (expected e.g. 7.0 or 8.6)")
    return int(m.group(1)), int(m.group(2) or 0)


def parse_target(spec: str | Target) -> Target:
    """Parse an explicit target: ``gpu:8.0``, ``gpu:8.0,6.1`` (GPU:0 and GPU:1), ``cpu``.

    ``cpu`` assumes a CPU with fast float16 and bfloat16 math (AMX / AVX512-FP16 / -BF16):
    it is meant for rewriting a model for a machine that is not this one.  ``auto`` is not
    handled here (see :func:`detect_target`).
    """
    if isinstance(spec, Target):
        return spec
    text = spec.strip().lower()
    cpu = Device("CPU", 0)
    if text == "cpu":
        return Target("cpu", (cpu,), description="cpu", assume_features=True)
    if text.startswith("gpu:"):
        caps = [_parse_capability(c) for c in text[4:].split(",") if c.strip()]
        if not caps:
            raise TargetError(f"bad target {spec!r}: no compute capability after 'gpu:'")
        gpus = tuple(Device("GPU", i, cap) for i, cap in enumerate(caps))
        return Target("gpu", gpus + (cpu,), description=text)
    raise TargetError(f"unknown target {spec!r}; expected 'auto', 'cpu', or 'gpu:X.Y[,X.Y...]'")


#: The spellings users bring for each low-precision type (compared case-insensitively).
PRECISION_SPELLINGS: dict[str, str] = {
    "auto": "auto",
    "float16": "float16", "fp16": "float16", "f16": "float16", "half": "float16",
    "mixed_float16": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16", "mixed_bfloat16": "bfloat16",
}


def parse_precision(value: object) -> str:
    """``"auto"``, ``"float16"`` or ``"bfloat16"`` from what a user passes: those names, their
    usual spellings (``fp16``, ``FP16``, ``half``, ``bf16``, Keras's ``mixed_float16``), or a
    dtype object with that name (``tf.float16``, ``np.float16``).  Pure.

    Raises :class:`TargetError` for anything else, listing what is accepted.
    """
    name = value if isinstance(value, str) else getattr(value, "name", None)
    if isinstance(name, str):
        found = PRECISION_SPELLINGS.get(name.strip().lower())
        if found is not None:
            return found
    accepted = "'auto', 'float16' (fp16, half), 'bfloat16' (bf16)"
    raise TargetError(f"unknown precision {value!r}; expected {accepted}")


def auto_precision(target: Target) -> tuple[Precision, str]:
    """The low-precision type to use on ``target``, and why.  Pure.

    GPUs take float16 (Tensor Cores from compute capability 7.0, and TensorFlow's and
    Keras's choice); CPUs take bfloat16 where they have fast bfloat16 math (float32's range,
    so nothing overflows and no loss scale is needed; oneDNN's choice), else float16 where
    only that is fast.  Where nothing is fast the type is the device's usual one, and the
    rewrite then says why it changed nothing.
    """
    if target.kind == "gpu":
        for d in target.eligible_devices("float16"):
            cap = f"{d.capability[0]}.{d.capability[1]}" if d.capability else "?"
            return "float16", f"GPU:{d.id} (compute capability {cap}) has float16 Tensor Cores"
        return "float16", "no GPU of compute capability >= 7.0; float16 is the GPU default"
    for precision in ("bfloat16", "float16"):
        if target.eligible_devices(precision):  # type: ignore[arg-type]
            cpu = target.default_device()
            have = sorted(set(CPU_FEATURES[precision]) & cpu.features)  # type: ignore[index]
            why = f"({', '.join(have)})" if have else "(assumed for an offline 'cpu' target)"
            return precision, f"the CPU has fast {precision} math {why}"  # type: ignore[return-value]
    return "bfloat16", "the CPU has no fast low-precision math; bfloat16 is the CPU default"


def resolve_precision(value: object, target: Target) -> tuple[Precision, str]:
    """``value`` (any spelling :func:`parse_precision` accepts) for ``target``: an explicit
    type as requested, ``"auto"`` as :func:`auto_precision` chooses.  Returns the type and
    the reason for it.  Pure."""
    precision = parse_precision(value)
    if precision == "auto":
        return auto_precision(target)
    return precision, "requested"  # type: ignore[return-value]


def cpu_features(cpuinfo_path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The instruction-set flags of this machine's CPU (empty if they cannot be read)."""
    try:
        with open(cpuinfo_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def detect_target() -> Target:
    """Describe this machine: its GPUs (with compute capability) if any, else its CPU.

    Reads TensorFlow's device list and ``/proc/cpuinfo``; call it only at the API/CLI
    boundary.
    """
    import tensorflow as tf

    cpu = Device("CPU", 0, None, cpu_features())
    gpus = []
    # The cost model prices float32 as TF32 from compute capability 8.0 unless TF32 is off.
    tf32_off = not tf.config.experimental.tensor_float_32_execution_enabled()
    for i, phys in enumerate(tf.config.list_physical_devices("GPU")):
        details = tf.config.experimental.get_device_details(phys)
        cap = details.get("compute_capability")
        features = set()
        if tf32_off and cap and tuple(cap) >= (8, 0):
            features.add("tf32_off")
        if GPUS_WITHOUT_TENSOR_CORES.search(str(details.get("device_name", ""))):
            features.add(NO_TENSOR_CORES)
        gpus.append(Device("GPU", i, tuple(cap) if cap else None, frozenset(features)))
    if gpus:
        desc = "auto: " + ", ".join(
            (f"GPU:{d.id} {d.capability[0]}.{d.capability[1]}" if d.capability else f"GPU:{d.id}")
            + (" (no Tensor Cores)" if NO_TENSOR_CORES in d.features else "")
            for d in gpus
        )
        return Target("gpu", tuple(gpus) + (cpu,), description=desc)
    known = {f for names in CPU_FEATURES.values() for f in names}
    return Target("cpu", (cpu,), description="auto: CPU " + (
        " ".join(sorted(cpu.features & known)) or "without low-precision features"))
