"""The API keys file with tenants' settings (services.tenants): what each line gives, and a bad
line refused naming it (never showing a key)."""

from __future__ import annotations

import pytest

from meshserve.services.tenants import DEFAULT, KeysError, TenantSettings, load_keys, parse_keys

KEY_A, KEY_A2, KEY_B = "sk-team-a-0123456789", "sk-team-a-abcdefghij", "sk-batch-0123456789"


def test_keys_map_to_tenants_and_settings_follow_the_tenant() -> None:
    keys = parse_keys(f"""
        # team a: two keys, its settings on one of them
        {KEY_A}  team-a  weight=2 priority=-1 max_concurrency=64 tpm=200000
        {KEY_A2} team-a
        {KEY_B}  batch   priority=5 daily_tokens=50000000 max_n=4 max_tokens=4096 admin=1   # the nightly jobs
    """, "keys")
    assert keys.tenants == {KEY_A: "team-a", KEY_A2: "team-a", KEY_B: "batch"}
    assert keys.of("team-a") == TenantSettings(weight=2.0, priority=-1, max_concurrency=64, tpm=200000)
    assert keys.of("batch") == TenantSettings(priority=5, daily_tokens=50_000_000, max_n=4, max_tokens=4096, admin=1)
    assert keys.of("someone-else") == DEFAULT == TenantSettings()


@pytest.mark.parametrize(("line", "says"), [
    (f"{KEY_A}", "expected 'KEY TENANT"),
    (f"{KEY_A} team/a", "expected 'KEY TENANT"),
    ("short team-a", "shorter than 8"),
    (f"{KEY_A} team-a wieght=2", "unknown setting 'wieght'"),
    (f"{KEY_A} team-a weight=0", "weight must be above 0"),
    (f"{KEY_A} team-a tpm=-5", "tpm must be at least 0"),
    (f"{KEY_A} team-a priority=high", "priority must be an integer"),
    (f"{KEY_A} team-a fast", "expected name=value"),
    (f"{KEY_A} team-a admin=2", "admin must be 0 or 1"),
])
def test_a_bad_line_is_refused_naming_it_and_not_its_key(line: str, says: str) -> None:
    with pytest.raises(KeysError) as e:
        parse_keys(f"{KEY_B} batch\n{line}\n", "keys.txt")
    assert str(e.value).startswith("keys.txt line 2: ") and says in str(e.value)
    assert KEY_A not in str(e.value)


def test_one_tenant_may_not_have_two_sets_of_settings() -> None:
    with pytest.raises(KeysError, match="line 2: settings of tenant 'team-a' differ from those on line 1"):
        parse_keys(f"{KEY_A} team-a weight=2\n{KEY_A2} team-a weight=3\n", "keys")
    with pytest.raises(KeysError, match="line 2: duplicate key"):
        parse_keys(f"{KEY_A} team-a\n{KEY_A} team-b\n", "keys")


def test_keys_from_the_environment_join_the_file(tmp_path) -> None:  # noqa: ANN001
    path = tmp_path / "keys"
    path.write_text(f"{KEY_A} team-a weight=2\n")
    keys = load_keys(str(path), {"MESHSERVE_API_KEYS": f"{KEY_B}=batch"})
    assert keys.tenants == {KEY_A: "team-a", KEY_B: "batch"} and keys.of("team-a").weight == 2.0
    assert load_keys("", {}).tenants == {}
