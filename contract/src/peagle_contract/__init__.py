"""Contracts shared by the CDK constructs and the serving image (standard library only)."""

from peagle_contract.drafter import MASK_HIDDEN, MASK_TOKEN_KEYS, DrafterCheckError, DrafterInfo, check_drafter_dir
from peagle_contract.request_log import EVENT_NAME, METRIC_FIELDS, MetricField, format_line, parse_line
from peagle_contract.serving import (
    DRAFTER_MODEL_DIR,
    TARGET_MODEL_DIR,
    ServingConfig,
    ServingConfigError,
    check_environment,
    environment_to_argv,
    speculative_config,
)

__all__ = [
    "DRAFTER_MODEL_DIR", "DrafterCheckError", "DrafterInfo", "EVENT_NAME", "MASK_HIDDEN", "MASK_TOKEN_KEYS", "METRIC_FIELDS",
    "MetricField", "ServingConfig", "ServingConfigError", "TARGET_MODEL_DIR", "check_drafter_dir",
    "check_environment", "environment_to_argv", "format_line", "parse_line", "speculative_config",
]
