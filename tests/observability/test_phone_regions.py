"""National phone numbers of the countries a deployment names, masked in every notation.

The patterns mask international numbers and the North American and grouped trunk-0 national
forms; every other country writes its national numbers its own way. For the regions named,
libphonenumber (``phonenumberslite``) finds each number valid there, and only valid ones: dates,
amounts, ports, versions and the digits of ids stay readable.
"""

from __future__ import annotations

import pytest
from loguru import logger

from pipecat_actions import ConfigurationError
from pipecat_actions.observability import redaction
from pipecat_actions.observability.redaction import (
    MASK,
    PHONE_REGIONS_ENV,
    Redactor,
    install_log_redaction,
    log_redactor,
    uninstall_log_redaction,
)
from pipecat_actions.testing import capture_logs

NATIONAL = {
    "FR": "01 42 68 53 00",
    "JP": "03-1234-5678",
    "DE": "030 901820",
    "AU": "(02) 9374 4000",
    "ES": "912 345 678",
    "BR": "(11) 91234-5678",
    "RU": "8 (495) 123-45-67",
    "IN": "098765 43210",
}

OPERATIONAL = (
    "booking bk_0001 at 20:00 on 2030-05-01 for 4, order 12345, ref AB-9931, amount 2000 "
    "cents, pid 23525 port 35615, version 1.14.0, at 1765119093.123, latency 0.30 s, "
    "operation op_01a250cc6ec94f330fe57089ca, args hash bb3bbe65817e"
)


@pytest.mark.parametrize(("region", "number"), NATIONAL.items(), ids=list(NATIONAL))
def test_a_national_number_of_a_named_region_is_masked(region: str, number: str) -> None:
    text = f"the caller said {number}, then hung up"
    assert Redactor(phone_regions=[region]).redact_text(text) == (
        f"the caller said {MASK}, then hung up"
    )


def test_the_patterns_alone_leave_a_french_national_number_unless_france_is_named() -> None:
    text = f"call back on {NATIONAL['FR']}"
    assert Redactor().redact_text(text) == text
    assert Redactor(phone_regions=["fr"]).redact_text(text) == f"call back on {MASK}"


def test_dates_amounts_ports_and_ids_stay_readable_with_every_region_named() -> None:
    every = Redactor(phone_regions=[*NATIONAL, "US", "GB"])
    assert every.redact_text(OPERATIONAL) == OPERATIONAL


def test_an_unknown_region_is_refused_naming_it() -> None:
    with pytest.raises(ConfigurationError, match=r"unknown phone region 'XX'.*US, GB, FR"):
        Redactor(phone_regions=["FR", "xx"])


def test_the_installed_redactor_takes_its_regions_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    uninstall_log_redaction()
    before = log_redactor().phone_regions
    monkeypatch.setenv(PHONE_REGIONS_ENV, "fr, jp")
    try:
        install_log_redaction()
        assert log_redactor().phone_regions == ("FR", "JP")
        with capture_logs("INFO", format="{message}") as lines:
            logger.info("callback {}", NATIONAL["JP"])
        assert lines == [f"callback {MASK}\n"]
        uninstall_log_redaction()
        monkeypatch.setenv(PHONE_REGIONS_ENV, "FR,Mars")
        with pytest.raises(ConfigurationError, match=rf"^\${PHONE_REGIONS_ENV}: unknown phone"):
            install_log_redaction()
    finally:
        uninstall_log_redaction()
        redaction.log_redactor().phone_regions = before
