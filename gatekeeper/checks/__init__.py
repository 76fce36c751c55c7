"""The input judged against the live API before anything is sent: models, and tokens measured."""
