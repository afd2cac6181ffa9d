"""`perseusctl`: the command line for operators and users. One module per command."""
