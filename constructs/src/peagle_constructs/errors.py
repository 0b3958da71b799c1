"""The one error type the constructs raise for bad configuration.

It is the contract's :class:`ServingConfigError`, so callers catch a single type whether the serving config
or a construct prop was wrong; the message always starts with the field name.
"""

from __future__ import annotations

from peagle_contract.serving import ServingConfigError


class ConfigError(ServingConfigError):
    """A construct prop is out of range: ``<field>: got <value>; allowed: <what>``."""

