"""Security lives in one module: no other module of the library or the stacks acknowledges a finding."""

from __future__ import annotations

from pathlib import Path

import peagle_constructs
import stacks

SECURITY = Path(peagle_constructs.__file__).with_name("security.py")


def test_acknowledgements_only_in_security_module():
    sources = [*Path(peagle_constructs.__file__).parent.glob("*.py"), *Path(stacks.__file__).parent.glob("*.py")]
    assert SECURITY in sources and len(sources) > 10
    offenders = [p.name for p in sources if p != SECURITY and (".acknowledge(" in p.read_text()
                                                               or "Acknowledgment(" in p.read_text())]
    assert offenders == []
    assert "Validations.of(construct).acknowledge(" in SECURITY.read_text()


def test_nag_packs_are_the_four_the_issue_names():
    from cdk_nag import AwsSolutionsChecks, HIPAASecurityChecks, NIST80053R5Checks, PCIDSS321Checks

    assert set(peagle_constructs.NAG_PACKS) == {AwsSolutionsChecks, HIPAASecurityChecks, NIST80053R5Checks,
                                                PCIDSS321Checks}


def test_the_readme_import_example_synthesizes_nag_clean():
    """The one import example in constructs/README.md runs as written."""
    import re

    readme = Path(peagle_constructs.__file__).parents[2] / "README.md"
    (example,) = re.findall(r"```python\n(.*?)```", readme.read_text(), flags=re.S)
    scope: dict = {}
    exec(compile(example, str(readme), "exec"), scope)  # noqa: S102 - our own documentation
    app, endpoint = scope["app"], scope["endpoint"]
    assert endpoint.endpoint_name == "Inference-Serving"
    for pack in peagle_constructs.NAG_PACKS:
        report = pack().validate_scope(scope["stack"])
        assert report.success, (pack.__name__, [v.rule_name for v in report.violations])
    app.synth()
