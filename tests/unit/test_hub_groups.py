"""tests/support/hub.hub_groups: which test modules run on one pytest-xdist worker."""

from ..support.hub import hub_groups


def test_modules_that_share_a_hub_directly_or_through_another_are_one_group():
    order = {"a": 0, "b": 1, "c": 2, "d": 3, "e": 4}
    wanted = {"X": [0, 2], "Y": [2, 4], "Z": [3]}  # a+c share X, c+e share Y, d alone
    assert hub_groups(order, wanted) == {"a": "a", "b": "b", "c": "a", "d": "d", "e": "a"}


def test_a_group_is_named_after_its_first_module_whatever_the_order_of_the_configs():
    order = {"a": 0, "b": 1, "c": 2}
    wanted = {"late": [1, 2], "early": [0, 2]}
    assert hub_groups(order, wanted) == {"a": "a", "b": "a", "c": "a"}


def test_no_hubs_every_module_alone():
    assert hub_groups({"a": 0, "b": 1}, {}) == {"a": "a", "b": "b"}
