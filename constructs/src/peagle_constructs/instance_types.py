"""What the constructs need to know about SageMaker GPU instance types.

Two facts drive the endpoint config: whether the family has local NVMe instance storage (then SageMaker
refuses a KMS key and a volume size, the disks being hardware-encrypted and fixed in size), and how many
GPUs a size has (tensor parallelism cannot exceed it). Families not listed here are refused rather than
guessed, because guessing the storage kind wrong fails only at deploy time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from peagle_constructs.errors import ConfigError

_INSTANCE_TYPE = re.compile(r"^ml\.(?P<family>[a-z][a-z0-9]*(?:-[a-z0-9]+)?)\.(?P<size>(?:\d+)?xlarge|large|medium)$")


@dataclass(frozen=True)
class GpuFamily:
    gpu_memory_gb: int  # per GPU, in GB as NVIDIA and AWS state it (10^9 bytes)
    local_nvme: bool  # instance-store volumes: no KMS key, no VolumeSizeInGB
    gpus_by_size: dict[str, int]
    # CUDA compute capability (major*10 + minor): the architecture the image's kernels must compile for
    compute_capability: int
    # Per size: (vCPUs, host memory in GiB), what inference components reserve cores and memory from.
    host_by_size: dict[str, tuple[int, int]]


_SINGLE_TO_16X = {"xlarge": 1, "2xlarge": 1, "4xlarge": 1, "8xlarge": 1, "16xlarge": 1}
# vCPUs and memory per size as the instance pages list them: the g4dn/g5/g6 sizes share one ladder.
_G_HOST = {"xlarge": (4, 16), "2xlarge": (8, 32), "4xlarge": (16, 64), "8xlarge": (32, 128), "16xlarge": (64, 256),
           "12xlarge": (48, 192), "24xlarge": (96, 384), "48xlarge": (192, 768)}
_G6E_HOST = {size: (cpus, 2 * memory) for size, (cpus, memory) in _G_HOST.items()}  # twice the memory per vCPU

# Storage kinds from the EC2/SageMaker instance-store tables; GPU counts per size from the instance pages;
# compute capabilities from NVIDIA's CUDA GPU table.
GPU_FAMILIES: dict[str, GpuFamily] = {
    "g4dn": GpuFamily(16, True, {**_SINGLE_TO_16X, "12xlarge": 4}, 75, _G_HOST),  # NVIDIA T4
    "g5": GpuFamily(24, True, {**_SINGLE_TO_16X, "12xlarge": 4, "24xlarge": 4, "48xlarge": 8}, 86, _G_HOST),  # A10G
    "g6": GpuFamily(24, True, {**_SINGLE_TO_16X, "12xlarge": 4, "24xlarge": 4, "48xlarge": 8}, 89, _G_HOST),  # L4
    "g6e": GpuFamily(48, True, {**_SINGLE_TO_16X, "12xlarge": 4, "24xlarge": 4, "48xlarge": 8}, 89,
                     _G6E_HOST),  # NVIDIA L40S
    "p3": GpuFamily(16, False, {"2xlarge": 1, "8xlarge": 4, "16xlarge": 8}, 70,
                    {"2xlarge": (8, 61), "8xlarge": (32, 244), "16xlarge": (64, 488)}),  # NVIDIA V100
    "p4d": GpuFamily(40, True, {"24xlarge": 8}, 80, {"24xlarge": (96, 1152)}),  # NVIDIA A100 40 GB
    "p4de": GpuFamily(80, True, {"24xlarge": 8}, 80, {"24xlarge": (96, 1152)}),  # NVIDIA A100 80 GB
    "p5": GpuFamily(80, True, {"4xlarge": 1, "48xlarge": 8}, 90,
                    {"4xlarge": (16, 256), "48xlarge": (192, 2048)}),  # NVIDIA H100
    "p5e": GpuFamily(141, True, {"48xlarge": 8}, 90, {"48xlarge": (192, 2048)}),  # NVIDIA H200
    "p5en": GpuFamily(141, True, {"48xlarge": 8}, 90, {"48xlarge": (192, 2048)}),  # NVIDIA H200
    "p6-b200": GpuFamily(179, True, {"48xlarge": 8}, 100, {"48xlarge": (192, 2048)}),  # NVIDIA B200
    "g7e": GpuFamily(96, True, {"2xlarge": 1, "4xlarge": 1, "8xlarge": 1, "12xlarge": 2, "24xlarge": 4,
                                "48xlarge": 8}, 120,
                     {"2xlarge": (8, 64), "4xlarge": (16, 128), "8xlarge": (32, 256), "12xlarge": (48, 512),
                      "24xlarge": (96, 1024), "48xlarge": (192, 2048)}),  # NVIDIA RTX PRO 6000 Blackwell Server
}


@dataclass(frozen=True)
class InstanceType:
    """A parsed, known SageMaker GPU instance type such as ``ml.g6e.xlarge``."""

    name: str
    family: str
    size: str

    @classmethod
    def of(cls, name: object, field_name: str = "instance_type") -> "InstanceType":
        match = _INSTANCE_TYPE.match(name) if isinstance(name, str) else None
        if not match:
            raise ConfigError(
                field_name, f"got {name!r}; allowed: 'ml.<family>.<size>', e.g. 'ml.g6e.xlarge' or 'ml.p5.48xlarge'"
            )
        family, size = match["family"], match["size"]
        known = GPU_FAMILIES.get(family)
        if known is None:
            raise ConfigError(
                field_name, f"got {name!r}: family {family!r} is not a known GPU family; allowed: {sorted(GPU_FAMILIES)}"
            )
        if size not in known.gpus_by_size:
            raise ConfigError(
                field_name, f"got {name!r}; allowed sizes for {family}: {sorted(known.gpus_by_size)}"
            )
        return cls(name=name, family=family, size=size)

    @property
    def spec(self) -> GpuFamily:
        return GPU_FAMILIES[self.family]

    @property
    def local_nvme(self) -> bool:
        return self.spec.local_nvme

    @property
    def gpu_count(self) -> int:
        return self.spec.gpus_by_size[self.size]

    @property
    def vcpus(self) -> int:
        return self.spec.host_by_size[self.size][0]

    @property
    def memory_mib(self) -> int:
        return self.spec.host_by_size[self.size][1] * 1024

    def __str__(self) -> str:
        return self.name
