"""``mae.errors.check_at_least``: one wording for a setting under its least value, in the error type asked."""

import pytest

from mae.errors import ConfigError, InputError, check_at_least


def test_check_at_least__the_least_value_passes_and_one_under_it_is_named_with_what_was_given():
    check_at_least("data.num_workers", 0, 0)
    with pytest.raises(ConfigError, match=r"^data\.num_workers must be >= 0, got -1$"):
        check_at_least("data.num_workers", -1, 0)


def test_check_at_least__a_rule_in_parentheses_and_another_error_type():
    with pytest.raises(ConfigError, match=r"^model\.num_classes must be >= 2 \(a classifier\), got 1$"):
        check_at_least("model.num_classes", 1, 2, rule="a classifier")
    with pytest.raises(InputError, match=r"^data\.max_images_per_class must be >= 1, got 0$"):
        check_at_least("data.max_images_per_class", 0, 1, error=InputError)
