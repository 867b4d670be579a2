mod catalog;
mod query;
mod store;
