"""slime's built-in reward rules (`--rm-type`), one module per family, each scoring what slime's scores.

- `mathd`: the boxed answer checked as the MATH grader does (Hendrycks' string normalisation, then sympy on
  the PRM800K normalisation): `math`, `deepscaler`, and the `boxed_` answer extraction.
- `dapo`: the Minerva `Answer: X` check against an integer label, scoring 1 or -1 (a dict, as slime's).
- `qa`: SQuAD token F1 (`f1`) and the GPQA multiple-choice letter (`gpqa`).
- `remote`: `remote_rm`, a POST of the sample to `--rm-url`.

Each rule takes the response text and the row's label; slime's own modules are the reference the unit
tests were checked against."""
