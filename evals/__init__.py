"""The pre-deployment evaluation harness: prompt x model x query grids through the chat pipeline,
the judge, agreement with human ratings, results, reports and model cards."""
