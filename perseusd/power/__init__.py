"""Power caps: what a node offers a power budget (`target.NodePowerTarget`)."""
