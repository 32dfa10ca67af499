"""The one sandbox: the embedded AWS (moto), provisioning from templates, the local run and its plot.
`beacon local`, the tests and the bench use it."""
