"""`dayzero-lm-eval`: lm-eval's command line with the "dayzero" model registered."""
import dayzero_lm_eval  # noqa: F401  (registers the model)


def main():
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
