"""``mae.training.sharding`` without processes: the optimizer state of a one-process checkpoint keyed by the
parameter names FSDP2 loads by, through the optimizer's own order."""

import torch
from torch import nn

from mae.convert.sharded_checkpoint import indexed_optimizer_state
from mae.training.sharding import named_optimizer_state


def _network_and_optimizer() -> tuple[nn.Module, torch.optim.Optimizer]:
    """Weights in one group and biases in another, as the weight-decay groups are: the optimizer numbers
    the parameters in another order than the network lists them."""
    torch.manual_seed(0)
    network = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    weights = [network[0].weight, network[1].weight]
    biases = [network[0].bias, network[1].bias]
    optimizer = torch.optim.AdamW([{"params": weights}, {"params": biases, "weight_decay": 0.0}])
    network(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    return network, optimizer


def test_named_optimizer_state__each_moment_under_its_parameters_name():
    network, optimizer = _network_and_optimizer()
    named = named_optimizer_state(optimizer.state_dict(), network, optimizer)
    assert [group["params"] for group in named["param_groups"]] == [
        ["0.weight", "1.weight"],
        ["0.bias", "1.bias"],
    ]
    for name, parameter in network.named_parameters():
        assert named["state"][name]["exp_avg"].shape == parameter.shape, name
        torch.testing.assert_close(named["state"][name]["exp_avg"], optimizer.state[parameter]["exp_avg"])
    assert named["param_groups"][1]["weight_decay"] == 0.0


def test_named_optimizer_state__undone_by_the_index_keying_a_sharded_checkpoint_is_read_with():
    network, optimizer = _network_and_optimizer()
    state = optimizer.state_dict()
    back = indexed_optimizer_state(named_optimizer_state(state, network, optimizer))
    assert back["param_groups"] == state["param_groups"]
    assert back["state"].keys() == state["state"].keys()
    for index, moments in state["state"].items():
        for key, value in moments.items():
            torch.testing.assert_close(back["state"][index][key], value)
