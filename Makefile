# Two commands for a fresh clone: each sets up what is missing (.ci/setup.sh), then runs its job.
#   make example   trains the Fashion-MNIST example (make example ARGS="--epochs 2" passes it arguments)
#   make test      the linter and the whole suite, newest and oldest versions: what CI runs (.ci/run)
.PHONY: example test

example:
	@bash .ci/example $(ARGS)

test:
	@bash .ci/test
